"""A worker that takes a task it already runs keeps its one attempt (`Worker._keep_one`).

Real pool (not burst), Postgres, Redis, Docker and the scripted LLM. Two ways
the running task comes back to its own worker: its own message through
XAUTOCLAIM once the lease lapsed (a loop that stalled past the lease), and a
second message (what reconciliation enqueues) taken while the lease is
missing. Either way: one attempt, one sandbox, the task succeeds, the running
attempt holds the lease, and no message stays pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from app.bus import keys, leases, queue
from app.config import Settings
from app.db.engine import Sessions, create_engine, create_sessions
from app.metrics import REGISTRY
from app.sandbox.reaper import TASK_LABEL
from app.schemas.tasks import LLMOptions, TaskCreate
from app.scripted import Script, ScriptedLLMServer, Turn
from app.services.tasks import service as tasks
from app.worker.pool import Worker

RUN_S = 12
"""How long the task's one bash step sleeps: the window in which it is taken again."""
DEADLINE_S = 90.0


def reclaims() -> float:
    return REGISTRY.get_sample_value("sandhive_worker_reclaimed_total") or 0.0


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def sandboxes_of(task_id: str) -> set[str]:
    """Ids of every container (running or not) labelled with the task, via the docker CLI."""
    proc = await asyncio.create_subprocess_exec(
        "docker", "ps", "-aq", "--no-trunc", "--filter", f"label={TASK_LABEL}={task_id}",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    return set(out.decode().split())


async def lease_holder(redis: Redis, task_id: str) -> str | None:
    value: Any = await redis.get(keys.task_lease(task_id))
    return None if value is None else str(value.decode())


class Watch:
    """Samples, while the worker runs, the task's sandboxes and who holds its lease.

    Stopped with `stop()` between samples, never cancelled: a cancel in the middle of
    `docker ps` would leave that process to be collected by a later test, where its
    "still running" ResourceWarning fails whatever test is running then.
    """

    def __init__(self, redis: Redis, task_id: str) -> None:
        self.redis = redis
        self.task_id = task_id
        self.sandboxes: set[str] = set()
        self.holders: set[str] = set()
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        while not self.stopping.is_set():
            self.sandboxes |= await sandboxes_of(self.task_id)
            holder = await lease_holder(self.redis, self.task_id)
            if holder is not None:
                self.holders.add(holder)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 0.1)

    def stop(self) -> None:
        self.stopping.set()


async def submit(sessions: Sessions, redis: Redis, settings: Settings, model: str) -> str:
    task = TaskCreate(prompt="work", llm=LLMOptions(model=model))
    return (await tasks.submit_task(sessions, redis, settings, "default", task, None))[0].id


async def only_message(redis: Redis) -> str:
    page: Any = await redis.xrange(keys.TASK_STREAM)
    assert len(page) == 1
    return str(page[0][0].decode())


async def running_on(sessions: Sessions, task_id: str) -> bool:
    return (await tasks.get_task(sessions, "default", task_id)).status == "running"


async def run_twice_taken(
    config: Settings,
    redis: Redis,
    scripted_llm: ScriptedLLMServer,
    caplog: pytest.LogCaptureFixture,
    model: str,
    meddle: Callable[[Sessions, str, str], Awaitable[None]],
    expect_log: str,
) -> tuple[Watch, str, str]:
    """Run one task on a real worker while `meddle` makes it come back; check the outcome.

    Returns the watch, the task id and the holder of the running attempt.
    """
    caplog.set_level(logging.INFO, logger="app.worker")
    turns = [Turn(tool="execute_bash", arguments={"command": f"sleep {RUN_S}"}), Turn("submit")]
    scripted_llm.add_script(model, Script(turns=turns))
    engine = create_engine(config.database_url)
    sessions = create_sessions(engine)
    worker = Worker(config)
    try:
        task_id = await submit(sessions, redis, config, model)
        holder = leases.holder_of(worker.name, await only_message(redis))
        watch = Watch(redis, task_id)
        watching = asyncio.create_task(watch.run())
        serving = asyncio.create_task(worker.run())
        try:
            await until("the task to run", lambda: running_on(sessions, task_id), DEADLINE_S)
            await meddle(sessions, task_id, holder)
            expected = expect_log.format(task_id)
            await until(
                "the worker to take it again",
                lambda: asyncio.sleep(0, any(expected in r.getMessage() for r in caplog.records)),
                DEADLINE_S,
            )

            async def finished() -> bool:
                return (await tasks.get_task(sessions, "default", task_id)).status != "running"

            await until("the task to finish", finished, DEADLINE_S)
            await until(
                "its messages to be acked",
                lambda: asyncio.sleep(0, worker.busy == 0),
                DEADLINE_S,
            )
        finally:
            try:
                worker.stop()
                await asyncio.wait_for(serving, DEADLINE_S)
            finally:
                watch.stop()
                await asyncio.wait_for(watching, DEADLINE_S)
        done = await tasks.get_task(sessions, "default", task_id)
    finally:
        await engine.dispose()
    assert (done.status, done.attempt) == ("succeeded", 1), "one attempt, and it finished"
    assert len(watch.sandboxes) == 1, f"one sandbox for the task: {watch.sandboxes}"
    assert scripted_llm.requests[model] == len(turns), "no second attempt asked the LLM"
    assert (await redis.xpending(keys.TASK_STREAM, keys.WORKER_GROUP))["pending"] == 0
    assert await queue.queued_task_ids(redis) == set(), "every message acked and deleted"
    assert await redis.keys(keys.task_lease("*")) == [], "the lease released"
    return watch, task_id, holder


async def test_its_own_message_back_through_xautoclaim_runs_nothing_twice(
    settings: Settings,
    redis: Redis,
    scripted_llm: ScriptedLLMServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Renewals further apart than the lease: what a loop stalled past the lease looks like to
    # Redis (Settings refuses this pair, model_copy does not validate). The lease lapses
    # between renewals, the message idles past it, the worker's own XAUTOCLAIM returns it.
    config = settings.model_copy(update={"worker_lease_s": 0.6, "worker_heartbeat_s": 4.0})
    before = reclaims()

    async def nothing(_sessions: Sessions, _task_id: str, _holder: str) -> None:
        pass

    watch, _task_id, holder = await run_twice_taken(
        config,
        redis,
        scripted_llm,
        caplog,
        "keep-one-own",
        nothing,
        "took back its own message of {}",
    )
    assert watch.holders == {holder}, "only the running attempt ever held the lease"
    assert reclaims() == before, "taking back its own message is no reclaim"
    assert not any(r.getMessage().startswith("reclaimed ") for r in caplog.records)


async def test_a_second_message_while_it_runs_is_dropped(
    settings: Settings,
    redis: Redis,
    scripted_llm: ScriptedLLMServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    heartbeat_s = 2.0
    config = settings.model_copy(update={"worker_lease_s": 10.0, "worker_heartbeat_s": heartbeat_s})
    seen_after: list[str | None] = []

    async def requeue_without_lease(sessions: Sessions, task_id: str, holder: str) -> None:
        lease = keys.task_lease(task_id)

        async def leased() -> bool:
            return bool(await redis.exists(lease))

        await until("the lease", leased, DEADLINE_S)
        # Right after a renewal (the lease's TTL jumps up) a whole heartbeat passes before
        # the next: drop the lease (Redis lost it) and enqueue the task again, as
        # reconciliation does. The worker reads that message at once and gets the lease.
        last = await redis.pttl(lease)

        async def renewed() -> bool:
            nonlocal last
            ttl, last = last, await redis.pttl(lease)
            return last > ttl

        await until("a renewal", renewed, DEADLINE_S)
        await redis.delete(lease)
        await queue.enqueue(redis, task_id)
        await until(
            "the duplicate to be dropped",
            lambda: asyncio.sleep(
                0, any("a duplicate message, dropped" in r.getMessage() for r in caplog.records)
            ),
            DEADLINE_S,
        )
        await asyncio.sleep(heartbeat_s * 1.5)  # the next renewal takes the lease back
        seen_after.append(await lease_holder(redis, task_id))
        assert (await tasks.get_task(sessions, "default", task_id)).status == "running", (
            "still running when the lease was checked"
        )

    _watch, _task_id, holder = await run_twice_taken(
        config,
        redis,
        scripted_llm,
        caplog,
        "keep-one-dup",
        requeue_without_lease,
        "took {} again while running it",
    )
    assert seen_after == [holder], "the running attempt's renewal took its lease back"
