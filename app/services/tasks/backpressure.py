"""Admission control for new tasks: a global queue depth and a per-tenant cap on active tasks.

Called inside the transaction that stores tasks. A per-tenant advisory lock makes the
tenant cap exact under concurrent submissions; the global depth is a soft limit (a few
may pass at once). Every submission of a tenant waits for that lock, holding a
connection meanwhile, so the hot paths (`services.tasks.submit_task`, `services.batch`)
call `admit` last, after their inserts (`added=True`): the lock is then held for two
statements and the commit, not for the inserts too (bench/scale.py: with the lock taken
first, one tenant's submissions queued on it and their waiting filled the API's pool).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, ScalarSelect, Select, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.db import models
from app.errors import TooManyRequests
from app.states import TaskStatus

ACTIVE = (TaskStatus.queued, TaskStatus.running)


async def admit(
    session: AsyncSession, settings: Settings, tenant: str, count: int = 1, *, added: bool = False
) -> None:
    """TooManyRequests when `count` more tasks would overfill the queue or the tenant's cap.

    `added`: this transaction has inserted those `count` tasks already (queued, so the
    counts include them); then call it last before the commit. The lock is taken in a
    statement of its own: the count's snapshot comes after it, so it sees every
    submission committed before this one got the lock.
    """
    await session.execute(
        text("SELECT pg_advisory_xact_lock(hashtext('sandhive.admit'), hashtext(:tenant))"),
        {"tenant": tenant},
    )
    retry = settings.backpressure_retry_after_s
    counts = (await session.execute(_counts(tenant))).one()
    own = count if added else 0  # counted already: what came before this submission is the rest
    queued = int(counts.queued) - own
    active = int(counts.active) + int(counts.episodes) - own
    if queued + count > settings.queue_max_depth:
        raise TooManyRequests(
            f"the queue is full ({queued} tasks waiting); retry later",
            retry,
            details={"limit": "queue_max_depth", "value": settings.queue_max_depth},
        )
    if active + count > settings.tenant_max_active_tasks:
        raise TooManyRequests(
            f"too many active tasks for this tenant ({active}); retry later",
            retry,
            details={"limit": "tenant_max_active_tasks", "value": settings.tenant_max_active_tasks},
        )


def _counts(tenant: str) -> Select[int, int, int]:
    """In one round trip: tasks queued (everyone's), the tenant's active tasks, and its open
    episodes (a trainer's episodes hold sandboxes too)."""
    tasks, episodes = models.Task, models.EpisodeRow
    return select(
        _count(tasks, tasks.status == TaskStatus.queued).label("queued"),
        _count(tasks, tasks.tenant_id == tenant, tasks.status.in_(ACTIVE)).label("active"),
        _count(
            episodes, episodes.tenant_id == tenant, episodes.status.in_(("opening", "open"))
        ).label("episodes"),
    )


def _count(table: type[Any], *conditions: ColumnElement[bool]) -> ScalarSelect[int]:
    return select(func.count()).select_from(table).where(*conditions).scalar_subquery()
