"""Step snapshots on a real Postgres: a step that stored no tar reads its `same_as` step's,
and expiry takes the old ones and every row that named one of them."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from app.db import models
from app.db.engine import Sessions
from app.ids import utc_now
from app.services.tasks import snapshots
from tests.support.rows import insert_task


async def test_a_step_that_changed_nothing_reads_the_tar_before_it(sessions: Sessions) -> None:
    task = await insert_task(sessions)
    await snapshots.save(sessions, task, 1, 0, b"tar of step 0")
    await snapshots.save(sessions, task, 1, 1, b"tar of step 0", same_as=0)
    await snapshots.save(sessions, task, 1, 1, b"a repeat is ignored")
    assert await snapshots.load(sessions, task, 1, 1) == b"tar of step 0"
    assert await snapshots.load(sessions, task, 1, 2) is None
    async with sessions() as session:
        assert await snapshots.stored(session, task, 1, 1)
        assert not await snapshots.stored(session, task, 2, 1)  # another attempt's: none


async def test_expiry_takes_old_snapshots_and_the_rows_that_named_them(
    sessions: Sessions,
) -> None:
    task = await insert_task(sessions)
    await snapshots.save(sessions, task, 1, 0, b"old")
    await snapshots.save(sessions, task, 1, 1, b"old", same_as=0)
    await snapshots.save(sessions, task, 1, 2, b"new")
    old = utc_now() - timedelta(days=30)
    async with sessions.begin() as session:
        row = await session.get(models.StepSnapshot, (task, 1, 0))
        assert row is not None
        row.created_at = old
    assert await snapshots.expire(sessions, utc_now() - timedelta(days=7)) == 2
    async with sessions() as session:
        left = list(await session.scalars(select(models.StepSnapshot.index)))
    assert left == [2]
    assert await snapshots.load(sessions, task, 1, 1) is None
