"""The row locks every status change goes through, and the tenant rule they apply."""

from __future__ import annotations

import pytest

from app.db.engine import Sessions
from app.errors import Conflict, NotFound
from app.ids import utc_now
from app.services.tasks import lifecycle
from tests.support.rows import insert_task


async def test_another_tenants_task_is_not_found_but_an_operator_sees_it(
    sessions: Sessions,
) -> None:
    foreign = await insert_task(sessions, tenant="someone-else")
    async with sessions.begin() as session:
        for task_id in ("tsk_nope", foreign):
            with pytest.raises(NotFound, match=f"no task {task_id}"):
                await lifecycle.lock_task(session, task_id, tenant="default")
        assert await lifecycle.lock_row(session, "tsk_nope") is None
        assert (await lifecycle.lock_task(session, foreign)).tenant_id == "someone-else"


async def test_a_finished_task_cannot_be_locked_to_change_it(sessions: Sessions) -> None:
    done = await insert_task(sessions, status="succeeded", finished_at=utc_now())
    running = await insert_task(sessions, status="running", attempt=1)
    async with sessions.begin() as session:
        with pytest.raises(Conflict, match=rf"task {done} already finished \(succeeded\)"):
            await lifecycle.lock_unfinished(session, done)
        assert (await lifecycle.lock_unfinished(session, running)).status == "running"
