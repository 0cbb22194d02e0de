"""The worker's EventSink: steps and durable events to Postgres, then to live followers.

Write-behind: the loop hands each write to one ordered writer task and goes on to
its next model call at once, so a step's transaction (~5 ms here) overlaps the
model's time instead of adding to it. Order is kept (durable and live events
leave in the order the loop made them); a failed durable write (a stale attempt,
Postgres down) is raised by the sink's next call, or by `flush`, which the worker
awaits (bounded) before it finishes the attempt. The price: an attempt that has
gone stale learns it one step later than it would have (one more model call and
command in its own sandbox, all of whose writes are refused). Every write is fenced by the attempt
(`services.attempts`). Usage is the loop's to count (`Outcome.usage`), not the sink's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import metrics
from app.agent.types import Step
from app.domain.rollout_capture import Compactor
from app.kit import cancelling
from app.schemas.tasks import ActionOut, EventOut, StepOut
from app.services import events
from app.services.tasks import attempts

MAX_BEHIND = 64
"""Writes the writer may lag behind the loop; past it a step waits (live events drop)."""
FLUSH_TIMEOUT_S = 30.0
"""How long the end of an attempt waits for its last writes (Postgres hanging, say)."""
CLOSE_DRAIN_S = 10.0
log = logging.getLogger(__name__)
Write = Callable[[], Awaitable[None]]


class TaskSink:
    """Records one attempt's steps; implements app.agent.types.EventSink."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], redis: Redis, task_id: str, attempt: int
    ) -> None:
        self.sessions, self.redis = sessions, redis
        self.task_id, self.attempt = task_id, attempt
        self._queue: asyncio.Queue[Write] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._failed: Exception | None = None
        self._captures = Compactor()
        """Token capture (`llm.capture`): each step stored as the delta to the one before."""

    async def step_started(self, index: int) -> None:
        task_id, attempt = self.task_id, self.attempt
        await self._durable(
            lambda: attempts.step_started(self.sessions, self.redis, task_id, attempt, index)
        )

    async def step_completed(self, step: Step, next_index: int | None = None) -> None:
        # One transaction: this step's row, its step.completed and the next step.started.
        out = stored_step(step, self.attempt)
        capture = None if step.capture is None else self._captures.compact(step.capture)
        await self._durable(
            lambda: attempts.save_step(
                self.sessions,
                self.redis,
                self.task_id,
                out,
                next_index,
                capture=capture,
                message=step.message,
            )
        )
        metrics.observe_step(step.llm_ms, step.tool_ms, step.prompt_tokens, step.completion_tokens)

    async def live(self, kind: str, data: Mapping[str, object]) -> None:
        if self._failed is not None or self._queue.qsize() >= MAX_BEHIND:
            metrics.LIVE_EVENTS_DROPPED.labels("backlog").inc()
            return
        event = events.live_event(self.task_id, kind, data)  # stamped now, sent in order
        self._enqueue(lambda: self._publish_live(event))

    async def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Wait until every write so far is done; raise the first durable write's failure.

        TimeoutError when the writes do not land within timeout_s: the attempt then
        ends like one whose write failed (another attempt will run the task).
        """
        if self._writer is not None:
            async with asyncio.timeout(timeout_s):
                await self._queue.join()
        if self._failed is not None:
            raise self._failed

    async def close(self) -> None:
        """Let the writer finish what it holds (bounded), then stop it, even when cancelled."""
        if self._writer is None:
            return
        try:
            with suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_DRAIN_S):
                    await self._queue.join()
        finally:
            await cancelling.stop([self._writer])  # also one whose cancel a write swallowed
            self._writer = None

    async def _durable(self, write: Write) -> None:
        if self._failed is not None:
            raise self._failed
        if self._queue.qsize() >= MAX_BEHIND:  # Postgres is slow: the loop waits for it
            await self._queue.join()
            if self._failed is not None:
                raise self._failed
        self._enqueue(write)

    def _enqueue(self, write: Write) -> None:
        self._queue.put_nowait(write)
        if self._writer is None:
            self._writer = asyncio.create_task(self._drain(), name=f"sink-{self.task_id}")

    async def _drain(self) -> None:
        while True:
            write = await self._queue.get()
            try:
                if self._failed is None:
                    await write()
            except Exception as exc:  # a stale attempt, Postgres down: the loop hears of it
                self._failed = exc
            finally:
                self._queue.task_done()

    async def _publish_live(self, event: EventOut) -> None:
        try:
            await events.publish(self.redis, event)
        except (RedisError, OSError) as exc:  # live-only events may be lost (API.md)
            metrics.LIVE_EVENTS_DROPPED.labels("publish_failed").inc()
            log.debug("live event of %s dropped: %r", self.task_id, exc)


def stored_step(step: Step, attempt: int) -> StepOut:
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
        interrupted=step.interrupted,
    )
