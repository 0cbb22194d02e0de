"""The worker's hot path, end to end on the real pool: one Postgres transaction per step,
and an event loop that no callback blocks (real Postgres, Redis, Docker, scripted LLM)."""

from __future__ import annotations

import asyncio
import gc
import logging
from dataclasses import replace
from itertools import groupby

import pytest
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
    caplog: pytest.LogCaptureFixture,
) -> None:
    """asyncio's debug mode logs every callback slower than the threshold: whole tasks
    (sandbox start cold and from the warm pool, pool refill, inputs, steps, editor,
    artifact collection, teardown) log none."""
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
    loop = asyncio.get_running_loop()
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
    loop.set_debug(True)
    loop.slow_callback_duration = 0.1
    try:
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            await Worker(settings).run(burst=True)
    finally:
        loop.set_debug(False)
        gc.unfreeze()
    done = [await tasks.get_task(sessions, "default", task_id) for task_id in ids]
    stored = [await artifacts.list_artifacts(sessions, "default", task_id) for task_id in ids]
    assert [t.status for t in done] == ["succeeded"] * 3
    assert [len(listing.items) for listing in stored] == [2] * 3, "artifacts were collected"
    assert warm_starts() > warm_before, "a task ran in a pooled sandbox"
    slow = [r.getMessage() for r in caplog.records if "Executing" in r.getMessage()]
    assert slow == []
