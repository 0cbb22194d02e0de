"""Admission control for new tasks: a global queue depth and a per-tenant cap on active tasks.

Called inside `services.tasks.submit_task`'s transaction, before the insert. A
per-tenant advisory lock makes the tenant cap exact under concurrent
submissions; the global depth is a soft limit (a few may pass at once).
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.db import models
from app.errors import TooManyRequests
from app.states import TaskStatus

ACTIVE = (TaskStatus.queued, TaskStatus.running)


async def admit(session: AsyncSession, settings: Settings, tenant: str, count: int = 1) -> None:
    """TooManyRequests when `count` more tasks would overfill the queue or the tenant's cap."""
    await session.execute(
        text("SELECT pg_advisory_xact_lock(hashtext('sandhive.admit'), hashtext(:tenant))"),
        {"tenant": tenant},
    )
    retry = settings.backpressure_retry_after_s
    queued = await _count(session, models.Task.status == TaskStatus.queued)
    if queued + count > settings.queue_max_depth:
        raise TooManyRequests(
            f"the queue is full ({queued} tasks waiting); retry later",
            retry,
            details={"limit": "queue_max_depth", "value": settings.queue_max_depth},
        )
    active = await _count(session, models.Task.tenant_id == tenant, models.Task.status.in_(ACTIVE))
    active += await open_episodes(session, tenant)  # a trainer's episodes hold sandboxes too
    if active + count > settings.tenant_max_active_tasks:
        raise TooManyRequests(
            f"too many active tasks for this tenant ({active}); retry later",
            retry,
            details={"limit": "tenant_max_active_tasks", "value": settings.tenant_max_active_tasks},
        )


async def _count(session: AsyncSession, *conditions: ColumnElement[bool]) -> int:
    query = select(func.count()).select_from(models.Task).where(*conditions)
    return int(await session.scalar(query) or 0)


async def open_episodes(session: AsyncSession, tenant: str) -> int:
    """The tenant's episodes (`/v1/episodes`) not yet ended: each holds a sandbox."""
    episodes = models.EpisodeRow
    query = select(func.count()).select_from(episodes)
    mine = query.where(episodes.tenant_id == tenant, episodes.status.in_(("opening", "open")))
    return int(await session.scalar(mine) or 0)
