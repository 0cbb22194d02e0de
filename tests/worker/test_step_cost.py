"""What one agent step costs the service's backends, counted, so that a change that adds
round trips to the hot path shows here (docs/performance.md): the Postgres statements the
worker sends and the Redis commands the server runs, per step, from two tasks of 2 and 8
steps through an in-process worker (their difference over 6 steps: the per-task costs,
start and end, cancel out). Counts, not times: these machines are noisy, counts are not."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import event
from sqlalchemy.engine import Engine

from app.api.app import create_app
from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from app.worker.pool import Worker
from tests.api.conftest import serve
from tests.support.redis_commands import commands_run

STATEMENTS_PER_STEP = 1.9
"""Postgres statements per step: 1.0 on an idle machine (2026-12-05: the step's one
statement, `services.tasks.step_rows`; 3.0 before it), a few tenths more in a loaded CI run
(a chore's statement falls in the longer task's time); one more on every step fails."""
REDIS_COMMANDS_PER_STEP = 8.0
"""Redis commands the server ran per step: 1.5-2.3 idle (2026-12-04), 4.3 in a loaded CI
run before the clocked chores were slowed here; a few more on every step fail."""


class Statements:
    """Every statement any engine in this process sends while counting."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, *_: Any) -> None:
        self.count += 1


@pytest.fixture
def statements() -> Iterator[Statements]:
    counter = Statements()
    event.listen(Engine, "before_cursor_execute", counter)
    yield counter
    event.remove(Engine, "before_cursor_execute", counter)


async def cost_of_a_task(
    steps: int,
    settings: Settings,
    api: httpx.AsyncClient,
    scripted_llm: ScriptedLLMServer,
    redis: Redis,
    statements: Statements,
) -> tuple[int, int]:
    """(statements, Redis commands) of one task of `steps` steps run by a burst worker."""
    model = f"cost-{uuid.uuid4().hex[:8]}"
    turns = [Turn("execute_bash", {"command": "true"})] * (steps - 1) + [Turn("submit", {})]
    scripted_llm.add_script(model, Script(turns))
    body = {"prompt": "p", "llm": {"model": model}, "limits": {"max_steps": steps + 1}}
    created = await api.post("/v1/tasks", json=body)
    assert created.status_code == 202, created.text
    before = (statements.count, await commands_run(redis))
    await Worker(settings).run(burst=True)
    after = (statements.count, await commands_run(redis) - 1)  # less this INFO
    task = (await api.get(f"/v1/tasks/{created.json()['id']}")).json()
    assert (task["status"], task["usage"]["steps"]) == ("succeeded", steps), task
    return after[0] - before[0], after[1] - before[1]


async def test_a_step_costs_a_few_statements_and_redis_commands(
    settings: Settings, scripted_llm: ScriptedLLMServer, redis: Redis, statements: Statements
) -> None:
    # The worker's chores that run on a clock, not per step, slowed or off: what is left
    # of them in the difference is noise a loaded machine makes larger (CI measured 4.3
    # Redis commands per step with them on).
    quiet = settings.model_copy(
        update={
            "worker_heartbeat_s": 5.0,
            "worker_lease_s": 30.0,
            "worker_concurrency": 1,
            "worker_cancel_poll_s": 30.0,
            "worker_reap_interval_s": 600.0,
            "webhook_poll_s": 600.0,
            "experiment_tick_s": 600.0,
            "episode_slots": 0,
            "sandbox_slots": 0,
        }
    )
    async with serve(create_app(quiet)) as api:
        short = await cost_of_a_task(2, quiet, api, scripted_llm, redis, statements)
        long = await cost_of_a_task(8, quiet, api, scripted_llm, redis, statements)
    per_step = [(b - a) / 6 for a, b in zip(short, long, strict=True)]
    print(f"per step: {per_step[0]:.1f} statements, {per_step[1]:.1f} Redis commands")
    assert per_step[0] <= STATEMENTS_PER_STEP, (short, long)
    assert per_step[1] <= REDIS_COMMANDS_PER_STEP, (short, long)
    assert per_step[0] > 0
    assert per_step[1] > 0, "a step is stored and published"
