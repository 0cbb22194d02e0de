"""The worker's hot path, end to end on the real pool: one Postgres transaction per step,
and an event loop that no callback blocks (real Postgres, Redis, Docker, scripted LLM)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from itertools import groupby

from redis.asyncio import Redis
from sqlalchemy import text

from app.config import Settings
from app.db.engine import Sessions
from app.metrics import REGISTRY
from app.schemas.tasks import InputFile, LLMOptions, TaskCreate
from app.scripted import Script, ScriptedLLMServer, Turn
from app.services.tasks import artifacts
from app.services.tasks import service as tasks
from app.worker.pool import Worker

STEPS = 5


def runqueue_wait_ns() -> int:
    """How long this thread has waited for a CPU so far (the kernel's schedstat)."""
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as stat:
        return int(stat.read().split()[1])


@contextmanager
def blocking_callbacks(threshold_s: float) -> Iterator[list[str]]:
    """The callbacks run meanwhile that held the event loop's thread for more than
    `threshold_s`: asyncio debug mode's measure (the time the callback took) less the time
    the thread waited for a CPU, which says how busy the machine was, not the callback."""
    slow: list[str] = []
    run = asyncio.events.Handle._run
    watched = asyncio.get_running_loop()  # not the scripted model server's, in its thread

    def timed(handle: asyncio.events.Handle) -> None:
        if handle._loop is not watched:
            run(handle)
            return
        started, waited = time.perf_counter_ns(), runqueue_wait_ns()
        run(handle)
        held = time.perf_counter_ns() - started - (runqueue_wait_ns() - waited)
        if held > threshold_s * 1e9:
            slow.append(f"{handle!r} held the loop {held / 1e9:.3f} s")

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]
    try:
        yield slow
    finally:
        asyncio.events.Handle._run = run  # type: ignore[method-assign]


async def test_a_callback_that_blocks_the_loop_is_caught_and_one_that_waits_is_not() -> None:
    """The measure above: a blocking sleep or a busy loop in a callback is caught; awaiting
    is not (the loop runs other callbacks meanwhile)."""

    def spin(seconds: float) -> None:  # of CPU time, however busy the machine
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    with blocking_callbacks(0.1) as slow:
        await asyncio.sleep(0.3)
        asyncio.get_running_loop().call_soon(time.sleep, 0.15)
        asyncio.get_running_loop().call_soon(spin, 0.15)
        await asyncio.sleep(0.05)
    assert len(slow) == 2, slow
    assert "sleep" in slow[0], slow
    assert "spin" in slow[1], slow


def warm_starts() -> float:
    """Sandboxes this process's workers took from a warm pool so far."""
    sample = "sandhive_worker_sandbox_start_seconds_count"
    return REGISTRY.get_sample_value(sample, {"source": "warm"}) or 0.0


def bash(command: str) -> Turn:
    return Turn(tool="execute_bash", arguments={"command": command})


async def submit(sessions: Sessions, redis: Redis, settings: Settings, model: str) -> str:
    task = TaskCreate(prompt="work", llm=LLMOptions(model=model))
    return (await tasks.submit_task(sessions, redis, settings, "default", task, None))[0].id


async def written_by(sessions: Sessions, task_id: str) -> list[tuple[str, str, str | None]]:
    """(inserting transaction id, type, step index) of each event of the task, in seq order.

    `xmin` is the id of the Postgres transaction that inserted the row: events
    that share it were committed together.
    """
    query = text(
        "SELECT xmin::text, type, data->>'index', seq FROM events WHERE task_id = :id ORDER BY seq"
    )
    async with sessions() as session:
        rows = (await session.execute(query, {"id": task_id})).all()
    assert [row[3] for row in rows] == list(range(1, len(rows) + 1)), "seq +1, no gaps"
    return [(row[0], row[1], row[2]) for row in rows]


async def test_each_step_costs_one_transaction(
    settings: Settings, redis: Redis, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    turns = [bash(f"echo {i} > output/f{i}.txt") for i in range(STEPS - 1)] + [Turn("submit")]
    scripted_llm.add_script("hot-path-tx", Script(turns=turns))
    task_id = await submit(sessions, redis, settings, "hot-path-tx")
    await Worker(settings).run(burst=True)
    done = await tasks.get_task(sessions, "default", task_id)
    events = await written_by(sessions, task_id)
    async with sessions() as session:
        query = text("SELECT index, xmin::text FROM steps WHERE task_id = :id ORDER BY index")
        step_rows = (await session.execute(query, {"id": task_id})).all()
    assert done.status == "succeeded"
    transactions = [
        [(kind, index) for _, kind, index in group] for _, group in groupby(events, lambda e: e[0])
    ]
    step_transactions = [t for t in transactions if t[0][0].startswith("step.")]
    expected = [
        [("step.started", "0")],
        *([("step.completed", str(i)), ("step.started", str(i + 1))] for i in range(STEPS - 1)),
        [("step.completed", str(STEPS - 1))],
    ]
    assert step_transactions == expected, "one commit per step: its end rides with the next start"
    assert len(step_transactions) == STEPS + 1
    assert transactions[:2] == [[("task.queued", None)], [("task.started", None)]]
    assert transactions[-1][-1] == ("task.finished", None)
    assert len(transactions) == STEPS + 4, "submit, start, first step.started, 1 per step, finish"
    completed_in = {index: xid for xid, kind, index in events if kind == "step.completed"}
    assert [(str(index), xid) for index, xid in step_rows] == sorted(completed_in.items()), (
        "each step row is committed with its step.completed event"
    )


async def test_the_worker_never_blocks_its_event_loop(
    settings: Settings,
    redis: Redis,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
) -> None:
    """No callback of whole tasks (sandbox start cold and from the warm pool, pool refill,
    inputs, steps, editor, artifact collection, teardown) holds the loop for 0.1 s: its own
    time, running or blocked, not the time it waited for a CPU that other processes held (a
    busy or parallel test run), as the kernel counts it (`blocking_callbacks`)."""
    turns = [
        bash("seq 1 20000"),
        Turn(
            tool="str_replace_editor",
            arguments={"command": "create", "path": "/testbed/output/a.txt", "file_text": "x" * 9},
        ),
        bash("head -c 300000 /dev/urandom | base64 > output/b.txt; cat input.txt"),
        Turn("submit"),
    ]
    scripted_llm.add_script("never-blocks", Script(turns=turns))
    # The first task thinks for a second: the pool is full when the next one comes.
    slow_first = [replace(turns[0], delay_s=1.0), *turns[1:]]
    scripted_llm.add_script("never-blocks-first", Script(turns=slow_first))
    settings = settings.model_copy(update={"warm_pool_size": 1, "worker_concurrency": 1})
    ids = []
    for model in ("never-blocks-first", "never-blocks", "never-blocks"):
        task = TaskCreate(
            prompt="work",
            llm=LLMOptions(model=model),
            input_files=[InputFile(path="input.txt", content_base64="aGVsbG8=")],
        )
        ids.append(
            (await tasks.submit_task(sessions, redis, settings, "default", task, None))[0].id
        )
    warm_before = warm_starts()
    # The whole suite's objects live in this process: a full garbage collection of
    # them lands in whichever callback runs (0.2+ s late in the suite). Freeze them
    # so what is timed is the worker's own work.
    gc.collect()
    gc.freeze()
    try:
        with blocking_callbacks(0.1) as slow:
            await Worker(settings).run(burst=True)
    finally:
        gc.unfreeze()
    done = [await tasks.get_task(sessions, "default", task_id) for task_id in ids]
    stored = [await artifacts.list_artifacts(sessions, "default", task_id) for task_id in ids]
    assert [t.status for t in done] == ["succeeded"] * 3
    assert [len(listing.items) for listing in stored] == [2] * 3, "artifacts were collected"
    assert warm_starts() > warm_before, "a task ran in a pooled sandbox"
    assert slow == []
