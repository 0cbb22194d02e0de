"""How a task's row is locked and ended: the one place its terminal status is written.

A cancel (API), an operator's fail or requeue and the worker's finish all take
the row under lock here (`lock_task`, `lock_unfinished`, `lock_row`), with the
tenant rule of `services.visibility`; they end it with `finish_row` inside
their own transaction and `publish_quietly` after the commit. The worker's
other status changes (start, hand back) stay in `services.attempts`, fenced by
attempt. Imported by services only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import models
from app.errors import Conflict
from app.ids import utc_now
from app.schemas.tasks import EventOut, UsageOut, storable
from app.services.events import TASK_FINISHED, publish, record_event
from app.services.tasks.notify import task_changed
from app.services.visibility import found, visible
from app.states import FinishReason, TaskStatus, is_terminal, status_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskEnd:
    """How a task ended (an attempt, a cancel, an operator), as stored on it."""

    reason: FinishReason
    answer: str | None = None
    usage: UsageOut | None = None
    error: str | None = None
    verification: dict[str, Any] | None = None
    """What the task's verifier found (`VerificationOut`'s JSON), when it ran."""
    diverged: dict[str, Any] | None = None
    """A fork's replay that was allowed to diverge, where it did (`app.runner.replay`)."""


async def lock_row(
    session: AsyncSession, task_id: str, *, tenant: str | None = None
) -> models.Task | None:
    """The task's row under lock (FOR UPDATE); None if missing or another tenant's."""
    return await session.scalar(
        select(models.Task).where(visible(task_id, tenant)).with_for_update()
    )


async def lock_task(
    session: AsyncSession, task_id: str, *, tenant: str | None = None
) -> models.Task:
    """The task's row under lock; NotFound if missing or another tenant's (invariant 6)."""
    return found(await lock_row(session, task_id, tenant=tenant), task_id)


async def lock_unfinished(
    session: AsyncSession, task_id: str, *, tenant: str | None = None
) -> models.Task:
    """As lock_task, and Conflict once the task has finished."""
    task = await lock_task(session, task_id, tenant=tenant)
    if is_terminal(TaskStatus(task.status)):
        raise Conflict(f"task {task_id} already finished ({task.status})")
    return task


async def finish_row(session: AsyncSession, task: models.Task, outcome: TaskEnd) -> list[EventOut]:
    """Give a locked task row its terminal state and its last durable event."""
    status = status_for(outcome.reason)
    usage = outcome.usage.model_dump() if outcome.usage is not None else task.usage
    task.status = status
    task.finish_reason = outcome.reason
    task.answer = storable(outcome.answer)
    task.usage = usage
    task.error = storable(outcome.error)
    task.finished_at = utc_now()
    data = {
        "status": status,
        "finish_reason": outcome.reason,
        "answer": task.answer,
        "usage": usage,
        "error": task.error,
    }
    if outcome.verification is not None:
        task.verification = data["verification"] = storable(outcome.verification)
    if outcome.diverged is not None:
        task.diverged = data["diverged"] = storable(outcome.diverged)
    await task_changed(session, task, TASK_FINISHED)  # the outbox row commits with the end
    return [await record_event(session, task.id, TASK_FINISHED, data)]


async def publish_quietly(redis: Redis, events: Sequence[EventOut]) -> None:
    """Tell live followers; a Redis outage only delays them (they catch up from Postgres)."""
    try:
        await publish(redis, *events)
    except (RedisError, OSError) as exc:
        log.warning("could not publish events of %s: %r", events[0].task_id, exc)
