"""The worker's sink: write-behind (the loop never waits on Postgres), order, failures, drops.

Real Postgres and Redis; a held row lock on the task stands in for a slow Postgres.
"""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest
from redis.asyncio import Redis
from sqlalchemy import select

from app.agent.types import Step
from app.bus import live
from app.db import models
from app.db.engine import Sessions
from app.ids import utc_now
from app.metrics import REGISTRY
from app.services.tasks import attempts
from app.services.tasks.attempts import StaleAttempt
from app.worker.sink import TaskSink
from tests.support.processes import free_port
from tests.support.rows import insert_task


def dropped() -> float:
    value = REGISTRY.get_sample_value(
        "sandhive_live_events_dropped_total", {"reason": "publish_failed"}
    )
    assert value is not None, "the series exists from the start"
    return value


def step(index: int) -> Step:
    return Step(index=index, thought=f"t{index}", observation=f"o{index}", started_at=utc_now())


async def running_task(sessions: Sessions, redis: Redis) -> tuple[str, int]:
    task_id = await insert_task(sessions)
    started = await attempts.start_attempt(sessions, redis, task_id, "w1", max_attempts=3)
    assert started is not None
    return task_id, started.attempt


async def stored(sessions: Sessions, task_id: str) -> list[tuple[int, str]]:
    async with sessions() as session:
        query = select(models.Event.seq, models.Event.type).where(models.Event.task_id == task_id)
        return [(seq, kind) for seq, kind in await session.execute(query.order_by("seq"))]


async def test_the_loop_goes_on_while_postgres_is_slow(
    clean_db: str, sessions: Sessions, redis: Redis
) -> None:
    task_id, attempt = await running_task(sessions, redis)
    sink = TaskSink(sessions, redis, task_id, attempt)
    blocker = await asyncpg.connect(clean_db.replace("+asyncpg", ""))
    try:
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute("SELECT 1 FROM tasks WHERE id = $1 FOR UPDATE", task_id)
        # Postgres cannot take any of these writes now; the loop must not notice.
        async with asyncio.timeout(5):
            await sink.step_started(0)
            for index in range(3):
                await sink.live("llm.delta", {"index": index})
                await sink.step_completed(step(index), index + 1 if index < 2 else None)
        assert await stored(sessions, task_id) == [(1, "task.started")]
        await lock.rollback()  # Postgres is back
        async with asyncio.timeout(10):
            await sink.flush()
    finally:
        await blocker.close()
        await sink.close()
    kinds = ["step.started"] + ["step.completed", "step.started"] * 2 + ["step.completed"]
    assert await stored(sessions, task_id) == [(1, "task.started")] + [
        (seq, kind) for seq, kind in enumerate(kinds, start=2)
    ]
    # Live followers got everything in the loop's order: each delta before its step's end.
    entries = await live.read_after(redis, task_id, "0-0", block_ms=1)
    seen = [json.loads(payload)["type"] for _, payload in entries]
    assert seen == ["task.started", "step.started"] + [
        "llm.delta",
        "step.completed",
        "step.started",
    ] * 2 + [
        "llm.delta",
        "step.completed",
    ]


async def test_a_stale_attempt_is_told_at_its_next_call(sessions: Sessions, redis: Redis) -> None:
    task_id, attempt = await running_task(sessions, redis)
    sink = TaskSink(sessions, redis, task_id, attempt)
    try:
        await sink.step_started(0)
        await sink.flush()
        # Another worker reclaims the task: this attempt's writes are refused from now on.
        newer = await attempts.start_attempt(sessions, redis, task_id, "w2", max_attempts=3)
        assert newer is not None
        assert newer.attempt == attempt + 1
        await sink.step_completed(step(0), 1)  # accepted by the sink, refused by Postgres
        with pytest.raises(StaleAttempt):
            await sink.flush()
        with pytest.raises(StaleAttempt):
            await sink.step_completed(step(1), None)  # and the loop hears of it
    finally:
        await sink.close()
    assert await stored(sessions, task_id) == [
        (1, "task.started"),
        (2, "step.started"),
        (3, "task.started"),
    ]


async def test_a_live_event_that_cannot_be_published_is_counted_not_raised(
    sessions: Sessions, redis: Redis
) -> None:
    # live() never touches Postgres
    dead = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.5)
    up = TaskSink(sessions, redis, "t-up", 1)
    down = TaskSink(sessions, dead, "t-down", 1)
    try:
        before = dropped()
        await up.live("tool.output", {"c": "a"})
        await up.flush()
        assert dropped() == before
        assert len(await live.read_after(redis, "t-up", "0-0", block_ms=1)) == 1

        await down.live("tool.output", {"c": "b"})
        await down.live("llm.delta", {"c": "c"})
        await down.flush()  # a lost live event is not a failure of the attempt
        assert dropped() == before + 2
    finally:
        await up.close()
        await down.close()
        await dead.aclose()
