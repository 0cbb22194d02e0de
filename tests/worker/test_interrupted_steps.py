"""A step cut short (a cancel, the task's timeout, a model failure) is stored as far as it got.

Viewers saw it live (`step.started`, the command, its output): the durable record keeps it,
as an interrupted step with its action and partial output, closed by a `step.completed`
before `task.finished`. Real worker, Postgres, Redis, Docker and the scripted LLM.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy import select

from app.bus import keys
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.schemas.tasks import TaskCreate, TaskOut
from app.scripted import Script, ScriptedLLMServer, Turn
from app.services.tasks import cancel
from app.services.tasks import service as tasks
from app.worker.pool import Worker
from tests.worker.conftest import running_worker

LONG_COMMAND = Turn(
    "execute_bash", {"command": "echo partial-out; echo partial-err >&2; sleep 600"}
)


@pytest.fixture
async def worker(settings: Settings) -> AsyncIterator[Worker]:
    async with running_worker(settings.model_copy(update={"llm_max_retries": 0})) as pool:
        yield pool


Submit = Callable[..., Awaitable[str]]


@pytest.fixture
def submit(
    settings: Settings,
    redis: Redis,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
    worker: Worker,
) -> Submit:
    """Submit a task playing `script` (under a name of its own) to the running worker."""

    async def submit(script: Script, **options: Any) -> str:
        name = f"cut-{uuid.uuid4().hex[:8]}"
        scripted_llm.add_script(name, script)
        body = TaskCreate.model_validate({"prompt": "p", "llm": {"model": name}, **options})
        return (await tasks.submit_task(sessions, redis, settings, "default", body, None))[0].id

    return submit


async def until_printed(redis: Redis, task_id: str, text: str, timeout_s: float = 60) -> None:
    """Wait until a `tool.output` event carried `text` (the command is running and printed).

    Only output counts: `tool.started` carries the command, which names the text too, and
    it is announced as soon as the model asks, possibly while the sandbox still starts.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entries = await redis.xrange(keys.live_events(task_id))
        events = [json.loads(entry[b"e"]) for _, entry in entries]
        if any(e["type"] == "tool.output" and text in e["data"]["chunk"] for e in events):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{task_id} never printed {text!r}")


async def until_finished(sessions: Sessions, task_id: str, timeout_s: float = 90) -> TaskOut:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        task = await tasks.get_task(sessions, "default", task_id)
        if task.finished_at is not None:
            return task
        await asyncio.sleep(0.2)
    raise AssertionError(f"{task_id} did not finish")


async def events_of(sessions: Sessions, task_id: str) -> list[tuple[str, dict[str, Any]]]:
    async with sessions() as session:
        rows = await session.scalars(
            select(models.Event).where(models.Event.task_id == task_id).order_by(models.Event.seq)
        )
        return [(row.type, row.data) for row in rows]


def assert_closed_before_the_end(events: list[tuple[str, dict[str, Any]]], reason: str) -> None:
    """Every started step is completed, the cut one marked, all before task.finished."""
    kinds = [kind for kind, _ in events]
    assert kinds[-1] == "task.finished", kinds
    started = [data["index"] for kind, data in events if kind == "step.started"]
    completed = [data for kind, data in events if kind == "step.completed"]
    assert [data["index"] for data in completed] == started, kinds
    assert completed[-1]["interrupted"] == reason


async def test_a_cancel_mid_command_keeps_the_step_with_its_output(
    submit: Submit, redis: Redis, sessions: Sessions
) -> None:
    task_id = await submit(Script([LONG_COMMAND]))
    await until_printed(redis, task_id, "partial-out")
    await cancel.cancel_task(sessions, redis, "default", task_id)
    task = await until_finished(sessions, task_id)
    assert task.finish_reason == "cancelled"

    trajectory = await tasks.get_trajectory(sessions, "default", task_id)
    assert len(trajectory.steps) == 1, "the step the viewer watched is kept"
    step = trajectory.steps[0]
    assert step.interrupted == "cancelled"
    assert step.action is not None
    assert "sleep 600" in step.action.arguments["command"]
    assert "partial-out" in step.observation
    assert "partial-err" in step.observation
    assert step.exit_code is None
    assert task.usage.steps == 1
    assert_closed_before_the_end(await events_of(sessions, task_id), "cancelled")


async def test_the_task_timeout_keeps_the_step_it_cut(submit: Submit, sessions: Sessions) -> None:
    task_id = await submit(Script([LONG_COMMAND]), limits={"timeout_s": 4})
    task = await until_finished(sessions, task_id)
    assert task.finish_reason == "timeout"
    steps = (await tasks.get_trajectory(sessions, "default", task_id)).steps
    assert [(s.index, s.interrupted) for s in steps] == [(0, "timeout")]
    assert "partial-out" in steps[0].observation
    assert_closed_before_the_end(await events_of(sessions, task_id), "timeout")


async def test_a_failing_model_closes_the_step_it_was_thinking_in(
    submit: Submit, sessions: Sessions
) -> None:
    turns = [Turn("execute_bash", {"command": "echo one"}), Turn("submit")]
    task_id = await submit(Script(turns, fail_status=500))
    task = await until_finished(sessions, task_id)
    assert task.finish_reason == "llm_error"
    steps = (await tasks.get_trajectory(sessions, "default", task_id)).steps
    assert [(s.index, s.interrupted, s.action) for s in steps] == [(0, "llm_error", None)]
    assert task.usage.steps == 0, "usage counts the model's answers; this one never came"
    assert_closed_before_the_end(await events_of(sessions, task_id), "llm_error")
