"""A task's step snapshots (`sandbox.snapshots: steps`): its sandbox's writable files after
each step, stored by its worker and read by a fork with `rebuild: snapshot` (docs/fork.md).

Kept `SANDHIVE_SNAPSHOT_RETENTION_S` (`expire`, a worker chore), or until their task is
deleted; a new attempt's replace nothing of an older attempt's, since a fork names the
attempt it starts from. A step that changed no file
stores no second copy: its row names the step whose tar is the same (`same_as`).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ColumnElement, and_, delete, exists, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from app.db import models
from app.db.engine import Sessions
from app.ids import utc_now

Snap = models.StepSnapshot


async def save(
    sessions: Sessions,
    task_id: str,
    attempt: int,
    index: int,
    archive: bytes,
    *,
    same_as: int | None = None,
) -> None:
    """Store the files after step `index` (once: a repeat, after a lost write, is ignored);
    with `same_as`, only that they are step `same_as`'s."""
    async with sessions.begin() as session:
        await session.execute(
            insert(Snap)
            .values(
                task_id=task_id,
                attempt=attempt,
                index=index,
                size=len(archive),
                archive=None if same_as is not None else archive,
                same_as=same_as,
                created_at=utc_now(),
            )
            .on_conflict_do_nothing()
        )


async def expire(sessions: Sessions, before: datetime) -> int:
    """Delete the snapshots stored before `before`, and those that named one of them as
    their tar (`same_as`): a fork from them is then a 409 naming replay. How many went."""
    holder = aliased(Snap)
    held = exists().where(
        holder.task_id == Snap.task_id,
        holder.attempt == Snap.attempt,
        holder.index == Snap.same_as,
    )
    async with sessions.begin() as session:
        old = await session.execute(delete(Snap).where(Snap.created_at < before))
        orphans = await session.execute(delete(Snap).where(and_(Snap.same_as.is_not(None), ~held)))
    return int(old.rowcount or 0) + int(orphans.rowcount or 0)  # type: ignore[attr-defined]


async def stored(session: AsyncSession, task_id: str, attempt: int, index: int) -> bool:
    """Whether the files after step `index` are stored."""
    found = await session.scalar(select(Snap.size).where(_at(task_id, attempt, index)))
    return found is not None


async def load(sessions: Sessions, task_id: str, attempt: int, index: int) -> bytes | None:
    """The tar after step `index` (its `same_as` step's when it stored none itself)."""
    async with sessions() as session:
        row = (
            await session.execute(
                select(Snap.archive, Snap.same_as).where(_at(task_id, attempt, index))
            )
        ).one_or_none()
        if row is None or row.archive is not None or row.same_as is None:
            return None if row is None else row.archive
        archive: bytes | None = await session.scalar(
            select(Snap.archive).where(_at(task_id, attempt, row.same_as))
        )
    return archive


def _at(task_id: str, attempt: int, index: int) -> ColumnElement[bool]:
    return and_(Snap.task_id == task_id, Snap.attempt == attempt, Snap.index == index)
