"""The worker's EventSink: steps and durable events to Postgres, then to live followers."""

from __future__ import annotations

from collections.abc import Mapping

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.agent.types import Step
from app.schemas import ActionOut, StepOut
from app.services import attempts, events


class TaskSink:
    """Records one attempt's steps; implements app.agent.types.EventSink."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], redis: Redis, task_id: str, attempt: int
    ) -> None:
        self.sessions, self.redis = sessions, redis
        self.task_id, self.attempt = task_id, attempt

    async def step_started(self, index: int) -> None:
        await attempts.step_started(self.sessions, self.redis, self.task_id, index)

    async def step_completed(self, step: Step) -> None:
        await attempts.save_step(
            self.sessions, self.redis, self.task_id, step_out(step, self.attempt)
        )

    async def live(self, kind: str, data: Mapping[str, object]) -> None:
        await events.publish(self.redis, events.live_event(self.task_id, kind, data))


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
