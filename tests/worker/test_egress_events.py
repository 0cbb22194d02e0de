"""BlockedRecorder: the egress proxy's refusals become a task's events, in the order the
proxy reported them, against real Postgres and Redis (no proxy or sandbox needed: the
proxy's hook is a plain call)."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from sqlalchemy import select

from app.db import models
from app.db.engine import Sessions
from app.services.tasks.network_events import NETWORK_BLOCKED
from app.worker import egress_events
from app.worker.egress_events import BlockedRecorder
from tests.support.rows import insert_task


async def stored(sessions: Sessions, task_id: str) -> list[tuple[int, str, str, int]]:
    """(seq, host, reason, attempt) of the task's network.blocked events, by seq."""
    async with sessions() as session:
        rows = await session.scalars(
            select(models.Event)
            .where(models.Event.task_id == task_id, models.Event.type == NETWORK_BLOCKED)
            .order_by(models.Event.seq)
        )
        return [(e.seq, e.data["host"], e.data["reason"], e.data["attempt"]) for e in rows]


async def test_refusals_are_stored_in_the_order_they_were_reported(
    sessions: Sessions, redis: Redis
) -> None:
    task_id = await insert_task(sessions, status="running", attempt=1)
    recorder = BlockedRecorder(sessions, redis)
    hosts = [f"h{i:02}.test" for i in range(40)]
    for i, host in enumerate(hosts):
        recorder(task_id, 1, host, f"reason {i}")
        if i % 7 == 3:
            await asyncio.sleep(0)  # a write starts while more refusals arrive
    await recorder.drain()
    events = await stored(sessions, task_id)
    assert [host for _, host, _, _ in events] == hosts
    assert [seq for seq, _, _, _ in events] == list(range(1, 41))  # gapless, from 1
    assert [reason for _, _, reason, _ in events] == [f"reason {i}" for i in range(40)]
    assert {attempt for _, _, _, attempt in events} == {1}


async def test_an_attempt_stores_at_most_its_cap_and_nothing_once_it_is_over(
    sessions: Sessions, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(egress_events, "MAX_EVENTS_PER_ATTEMPT", 5)
    running = await insert_task(sessions, status="running", attempt=2)
    ended = await insert_task(sessions, status="succeeded", attempt=1)
    recorder = BlockedRecorder(sessions, redis)
    for i in range(12):
        recorder(running, 2, f"r{i}.test", "not allowed")
        recorder(running, 1, f"old{i}.test", "not allowed")  # an earlier attempt: fenced out
        recorder(ended, 1, f"e{i}.test", "not allowed")
    await recorder.drain()
    assert [host for _, host, _, _ in await stored(sessions, running)] == [
        f"r{i}.test" for i in range(5)
    ]
    assert await stored(sessions, ended) == []
