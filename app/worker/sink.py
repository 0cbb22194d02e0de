"""The worker's EventSink: steps and durable events to Postgres, then to live followers.

Every write is fenced by the attempt (`services.attempts`); the usage of the
steps recorded so far is kept here, for an attempt that is stopped mid-way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import metrics
from app.agent.types import Step
from app.schemas import ActionOut, StepOut, UsageOut
from app.services import attempts, events

log = logging.getLogger(__name__)


class TaskSink:
    """Records one attempt's steps; implements app.agent.types.EventSink."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], redis: Redis, task_id: str, attempt: int
    ) -> None:
        self.sessions, self.redis = sessions, redis
        self.task_id, self.attempt = task_id, attempt
        self.usage = UsageOut()

    async def step_started(self, index: int) -> None:
        await attempts.step_started(self.sessions, self.redis, self.task_id, self.attempt, index)

    async def step_completed(self, step: Step) -> None:
        await attempts.save_step(
            self.sessions, self.redis, self.task_id, step_out(step, self.attempt)
        )
        metrics.observe_step(step.llm_ms, step.tool_ms, step.prompt_tokens, step.completion_tokens)
        self.usage.steps += 1
        self.usage.prompt_tokens += step.prompt_tokens
        self.usage.completion_tokens += step.completion_tokens
        self.usage.llm_seconds += step.llm_ms / 1000
        self.usage.sandbox_seconds += step.tool_ms / 1000

    async def live(self, kind: str, data: Mapping[str, object]) -> None:
        try:
            await events.publish(self.redis, events.live_event(self.task_id, kind, data))
        except (RedisError, OSError) as exc:  # live-only events may be lost (API.md)
            log.debug("live event of %s dropped: %r", self.task_id, exc)


def step_out(step: Step, attempt: int) -> StepOut:
    action = step.action
    return StepOut(
        index=step.index,
        attempt=attempt,
        thought=step.thought,
        reasoning=step.reasoning,
        action=ActionOut(tool=action.tool, arguments=action.arguments) if action else None,
        observation=step.observation,
        exit_code=step.exit_code,
        started_at=step.started_at,
        llm_ms=step.llm_ms,
        tool_ms=step.tool_ms,
        prompt_tokens=step.prompt_tokens,
        completion_tokens=step.completion_tokens,
    )
