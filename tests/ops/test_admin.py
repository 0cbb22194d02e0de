"""`sandhive admin`: workers and slots from heartbeats, drain, requeue, fail, prune."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select
from typer.testing import CliRunner

from app.bus import keys, leases, queue
from app.cli.main import cli
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.errors import Conflict
from app.ids import utc_now
from app.services.admin import service as admin
from tests.support.private_redis_fixtures import private_redis_url  # noqa: F401 (a fixture)
from tests.support.processes import settings_env
from tests.support.redis_commands import commands_run
from tests.support.rows import insert_artifact, insert_task


async def beat(redis: Redis, name: str, slots: int, busy: int) -> None:
    info = {"host": "h1", "pid": 42, "tasks": busy, "slots": slots}
    await leases.beat(redis, name, 10_000, info)


async def test_workers_lists_heartbeats_with_slots_and_drain(redis: Redis) -> None:
    await beat(redis, "w-a", 4, 1)
    await beat(redis, "w-b", 2, 0)
    await redis.set(keys.task_lease("tsk_x"), "w-a|1-0")  # other sandhive keys are not workers
    await admin.drain(redis, "w-b")
    found = await admin.list_workers(redis)
    assert [(w.name, w.slots, w.busy, w.draining) for w in found] == [
        ("w-a", 4, 1, False),
        ("w-b", 2, 0, True),
    ]
    await leases.forget(redis, "w-a")
    assert [w.name for w in await admin.list_workers(redis)] == ["w-b"]


async def test_workers_are_read_in_a_few_commands_however_many_there_are(
    private_redis_url: str,  # noqa: F811 (the fixture imported above)
) -> None:
    """A sandbox's and an episode's placement list the workers on every create: their
    heartbeats and drain flags in one round trip, not two commands per worker. Counted on
    a Redis server of this test's own (`INFO commandstats`), so nothing else adds to it."""
    private = Redis.from_url(private_redis_url)
    try:
        await private.flushdb()
        for n in range(20):
            info = {"host": "h1", "pid": n, "tasks": 0, "slots": 1, "images": [f"img-{n}"]}
            await leases.beat(private, f"w-{n:02}", 10_000, info)
        await admin.drain(private, "w-07")
        before = await commands_run(private)
        found = await admin.list_workers(private)
        images = await leases.live_images(private)
        ran = await commands_run(private) - before - 1  # less the first INFO
    finally:
        await private.aclose()
    assert [w.name for w in found] == [f"w-{n:02}" for n in range(20)]
    assert [w.name for w in found if w.draining] == ["w-07"]
    assert images == {f"img-{n}" for n in range(20)}
    assert ran <= 5, f"{ran} commands for 20 workers (two SCANs, three MGETs)"


def test_workers_command_prints_them(settings: Settings, redis: Redis) -> None:
    async def seed() -> None:
        client = Redis.from_url(settings.redis_url)
        await beat(client, "w-cli", 3, 2)
        await client.aclose()

    asyncio.run(seed())
    result = CliRunner().invoke(cli, ["admin", "workers"], env=settings_env(settings))
    assert result.exit_code == 0, result.output
    assert "w-cli\th1\t42\t2/3\tactive" in result.output


def test_a_drained_worker_stops_claiming_and_exits(settings: Settings, tmp_path: Path) -> None:
    fast = settings.model_copy(update={"worker_heartbeat_s": 0.3, "worker_name": "w-drain"})
    env = settings_env(fast)
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "worker"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while "w-drain\t" not in (CliRunner().invoke(cli, ["admin", "workers"], env=env)).output:
            assert time.monotonic() < deadline, log.read_text()
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        result = CliRunner().invoke(cli, ["admin", "drain", "w-drain"], env=env)
        assert result.exit_code == 0, result.output
        assert proc.wait(timeout=60) == 0, log.read_text()
        assert "drained by an operator" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_requeue_puts_queued_and_running_tasks_back(sessions: Sessions, redis: Redis) -> None:
    queued = await insert_task(sessions)
    running = await insert_task(sessions, status="running", attempt=1)
    await redis.set(keys.task_lease(running), "w-gone|1-0")
    assert await admin.requeue(sessions, redis, queued) == "queued"
    assert await admin.requeue(sessions, redis, running) == "running"
    assert await queue.queued_task_ids(redis) >= {queued, running}
    assert await redis.get(keys.task_lease(running)) is None  # its worker sees the lease lost
    done = await insert_task(sessions, status="succeeded", finished_at=utc_now())
    with pytest.raises(Conflict):
        await admin.requeue(sessions, redis, done)


async def test_requeue_refuses_a_task_its_live_worker_holds(
    sessions: Sessions, redis: Redis
) -> None:
    """Its worker renews the lease ("a lease Redis lost is re-created") and the requeued
    message would be acked as a duplicate: the command must not say it worked."""
    running = await insert_task(sessions, status="running", attempt=1)
    await redis.set(keys.task_lease(running), "w-live|1-0")
    await leases.beat(redis, "w-live", 60_000, {"host": "h", "pid": 1, "slots": 1, "tasks": 1})
    before = await queue.queued_task_ids(redis)
    with pytest.raises(Conflict, match=r"running on worker w-live, which is alive") as refused:
        await admin.requeue(sessions, redis, running)
    assert "admin fail" in refused.value.message
    assert "admin drain w-live" in refused.value.message
    assert await redis.get(keys.task_lease(running)) == b"w-live|1-0", "its lease untouched"
    assert running not in await queue.queued_task_ids(redis) - before, "not enqueued"


async def test_fail_ends_a_task_with_an_event(sessions: Sessions, redis: Redis) -> None:
    task_id = await insert_task(sessions, status="running", attempt=1)
    await admin.fail(sessions, redis, task_id, "stuck for a day")
    async with sessions() as session:
        task = await session.get(models.Task, task_id)
        events = list(
            await session.scalars(select(models.Event).where(models.Event.task_id == task_id))
        )
    assert task is not None
    assert (task.status, task.finish_reason) == ("failed", "sandbox_error")
    assert task.error == "failed by an operator: stuck for a day"
    assert [event.type for event in events] == ["task.finished"]
    assert await redis.exists(keys.cancel_flag(task_id))
    with pytest.raises(Conflict):
        await admin.fail(sessions, redis, task_id, "again")


async def test_prune_by_age(sessions: Sessions, settings: Settings) -> None:
    now = utc_now()
    ancient = await insert_task(sessions, status="succeeded", finished_at=now - timedelta(days=40))
    old = await insert_task(sessions, status="failed", finished_at=now - timedelta(days=10))
    fresh = await insert_task(sessions, status="succeeded", finished_at=now - timedelta(hours=1))
    running = await insert_task(sessions, status="running", attempt=1)
    for task_id in (ancient, old, fresh):
        await insert_artifact(sessions, task_id, "a.txt", b"x", "text/plain")
    env = {**settings_env(settings), "SANDHIVE_TASK_RETENTION_DAYS": "30"}
    env["SANDHIVE_ARTIFACT_RETENTION_DAYS"] = "7"
    # The CLI runs its own event loop: give it a thread of its own.
    result = await asyncio.to_thread(CliRunner().invoke, cli, ["admin", "prune"], env=env)
    assert result.exit_code == 0, result.output
    assert "pruned 1 tasks and 1 artifacts" in result.output
    async with sessions() as session:
        left = set(await session.scalars(select(models.Task.id)))
        with_artifacts = set(await session.scalars(select(models.Artifact.task_id)))
        orphans = await session.scalar(
            select(func.count())
            .select_from(models.Artifact)
            .where(models.Artifact.task_id == ancient)
        )
    assert {old, fresh, running} <= left
    assert ancient not in left
    assert with_artifacts == {fresh}
    assert orphans == 0


def test_admin_refusal_exits_1(settings: Settings) -> None:
    result = CliRunner().invoke(cli, ["admin", "fail", "tsk_nope"], env=settings_env(settings))
    assert result.exit_code == 1
