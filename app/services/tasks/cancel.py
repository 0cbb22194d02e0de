"""Cancelling a task: a queued one ends at once, a running one is stopped by its worker.

Imported by the API. The request is recorded on the task row (durable, read by
any worker that starts or runs the task) and then flagged in Redis (the fast
path the running worker polls), so it survives a Redis that loses its data.
"""

from __future__ import annotations

import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.bus import cancel
from app.ids import utc_now
from app.schemas.tasks import EventOut, TaskOut
from app.services.tasks.lifecycle import TaskEnd, finish_row, lock_unfinished, publish_quietly
from app.services.tasks.service import task_out
from app.states import FinishReason, TaskStatus

log = logging.getLogger(__name__)


async def cancel_task(
    sessions: async_sessionmaker[AsyncSession], redis: Redis, tenant: str, task_id: str
) -> TaskOut:
    """Cancel the tenant's task: Conflict if it already finished, NotFound if it is not theirs."""
    events: list[EventOut] = []
    async with sessions.begin() as session:
        task = await lock_unfinished(session, task_id, tenant=tenant)
        if task.status == TaskStatus.queued:
            # Never started: no sandbox to stop; the worker that takes its message skips it.
            outcome = TaskEnd(FinishReason.cancelled, error="cancelled before it started")
            events = await finish_row(session, task, outcome)
        else:
            task.cancel_requested_at = task.cancel_requested_at or utc_now()
        out = task_out(task)
    await publish_quietly(redis, events)
    if out.status == TaskStatus.running:
        await _flag(redis, task_id)
    return out


async def _flag(redis: Redis, task_id: str) -> None:
    try:
        await cancel.raise_flag(redis, task_id)
    except (RedisError, OSError) as exc:
        # The row says "cancel"; the worker reads it at its next lease renewal.
        log.warning("could not flag the cancel of %s in Redis: %r", task_id, exc)
