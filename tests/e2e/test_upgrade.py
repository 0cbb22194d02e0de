"""The rolling upgrade of docs/operations.md ("Upgrades"), rehearsed with real processes.

1. `sandhive migrate` on a fresh database: a second run is a no-op, and several
   replicas running it at once (compose `migrate`, or every host's entrypoint)
   serialise on a Postgres advisory lock instead of colliding.
2. An "old" worker runs a batch, a "new" one joins, the old one gets SIGTERM
   mid-batch and hands back what it cannot finish in its grace period. Every task
   ends succeeded exactly once, with one complete attempt's steps and no attempt
   counted as lost. Old and new are the same code here: the test rehearses the
   process overlap; the schema side is kept safe by the additive (expand, then
   contract) migration rule, which two versions of the code can share.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.conftest import ADMIN_URL
from tests.e2e.fault_harness import (
    ContainerWatch,
    _sql,
    check_consistency,
    cluster_with_api,
    db_events,
    fault_settings,
    submit,
    wait_terminal,
    wait_until,
)
from tests.support.database import create_database, drop_database
from tests.support.private_redis import PrivateRedis

MIGRATIONS = len(list((Path(__file__).parents[2] / "migrations" / "versions").glob("*.py")))
STEPS = 4
"""Bash steps per task; the submit makes one more."""
BATCH = 10
"""Tasks in the rolling upgrade's batch."""


@pytest.fixture
def fresh_database() -> Iterator[str]:
    """An empty database of this test's own (asyncpg URL), dropped afterwards."""
    name = f"sandhive_upgrade_{os.getpid()}"
    asyncio.run(create_database(ADMIN_URL, name))
    base = ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
    yield f"{base}/{name}"
    asyncio.run(drop_database(ADMIN_URL, name))


def start_migrate(database_url: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHIVE_")}
    env["SANDHIVE_DATABASE_URL"] = database_url
    return subprocess.Popen(
        [sys.executable, "-m", "app", "migrate"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def migrate(database_url: str) -> str:
    proc = start_migrate(database_url)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return out


def upgrades_in(output: str) -> int:
    """How many migrations a `sandhive migrate` applied (Alembic logs one line each)."""
    return output.count("Running upgrade")


def schema_version(database_url: str) -> list[str]:
    return [r["version_num"] for r in _sql(database_url, "SELECT version_num FROM alembic_version")]


def test_migrate_twice_in_a_row_is_a_no_op_the_second_time(fresh_database: str) -> None:
    first = migrate(fresh_database)
    assert upgrades_in(first) == MIGRATIONS, first
    head = schema_version(fresh_database)
    assert len(head) == 1
    insert = "INSERT INTO api_keys (id, tenant_id, name, key_sha256, created_at)"
    _sql(fresh_database, f"{insert} VALUES ('key_1', 't', 'n', 'h', now())")

    second = migrate(fresh_database)
    assert upgrades_in(second) == 0, second
    assert schema_version(fresh_database) == head
    assert len(_sql(fresh_database, "SELECT id FROM api_keys")) == 1, "data untouched"


def test_concurrent_migrate_runs_apply_each_migration_once(fresh_database: str) -> None:
    runs = [start_migrate(fresh_database) for _ in range(3)]
    outputs = [proc.communicate(timeout=180)[0] for proc in runs]
    assert [proc.returncode for proc in runs] == [0, 0, 0], "\n".join(outputs)
    assert sum(upgrades_in(out) for out in outputs) == MIGRATIONS, "\n".join(outputs)
    assert len(schema_version(fresh_database)) == 1
    assert upgrades_in(migrate(fresh_database)) == 0


def slow_script(delay_s: float) -> Script:
    turns = [
        Turn(tool="execute_bash", arguments={"command": f"echo {i}"}, delay_s=delay_s)
        for i in range(STEPS)
    ]
    return Script(turns=[*turns, Turn(tool="submit", arguments={})])


def started_by(database_url: str, task_id: str) -> list[tuple[int, str]]:
    return [
        (e["data"]["attempt"], e["data"]["worker"])
        for e in db_events(database_url, task_id)
        if e["type"] == "task.started"
    ]


def step_indices(database_url: str, task_id: str) -> dict[int, list[int]]:
    """Step indices recorded per attempt."""
    rows = _sql(
        database_url,
        "SELECT attempt, index FROM steps WHERE task_id = $1 ORDER BY attempt, index",
        task_id,
    )
    found: dict[int, list[int]] = {}
    for row in rows:
        found.setdefault(row["attempt"], []).append(row["index"])
    return found


def test_rolling_worker_restart_loses_and_duplicates_nothing(
    settings: Settings,
    fresh_database: str,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    assert upgrades_in(migrate(fresh_database)) == MIGRATIONS  # step 1: migrate once
    scripted_llm.add_script("upgrade-batch", slow_script(delay_s=1.5))
    # max_attempts=1: an attempt wrongly counted as lost would fail its task `worker_lost`.
    config = fault_settings(
        settings,
        private_redis.url,
        database_url=fresh_database,
        worker_shutdown_grace_s=1.0,
        worker_max_attempts=1,
    )
    url = config.database_url
    with (
        cluster_with_api(config, tmp_path) as (procs, client),
        ContainerWatch(config.instance_name()) as watch,
    ):
        old = procs.start_worker("old")
        # Deep enough that the old worker is still busy when the new one has joined, however
        # slowly a loaded machine starts the new one.
        ids = [submit(client, "upgrade-batch") for _ in range(BATCH)]

        def finished() -> int:
            return sum(client.get(f"/v1/tasks/{t}").json()["status"] == "succeeded" for t in ids)

        wait_until("the old worker's first tasks", lambda: finished() >= 1, 90)
        procs.start_worker("new")  # step 2: the new version joins while the old one works
        wait_until(
            "the new worker to take tasks",
            lambda: any(("new" in dict(started_by(url, t)).values()) for t in ids),
            60,
        )
        # Stopped while a task of its has most of its steps to go: it cannot finish within
        # the grace, so it is handed back, however slowly this machine runs.
        on_old = wait_until(
            "a task just begun on the old worker",
            lambda: [t for t in ids if _begun_on(client, url, t) == "old"],
            60,
            interval_s=0.05,
        )
        old.send_signal(signal.SIGTERM)  # step 3: the old one leaves, handing back what it runs
        assert old.wait(timeout=config.worker_shutdown_grace_s + 20) == 0, procs.logs()

        tasks = [wait_terminal(client, t, timeout_s=120) for t in ids]
    assert [(t["status"], t["finish_reason"]) for t in tasks] == [
        ("succeeded", "submitted")
    ] * BATCH, procs.logs()
    watch.assert_one_at_a_time()
    check_consistency(config, ids, private_redis.client())

    handed_back = 0
    for task in tasks:
        runs = started_by(url, task["id"])
        attempts = [attempt for attempt, _ in runs]
        assert attempts == list(range(1, task["attempt"] + 1)), runs  # counted, none skipped
        steps = step_indices(url, task["id"])
        assert steps[task["attempt"]] == list(range(STEPS + 1)), steps  # one complete attempt
        for attempt, indices in steps.items():
            if attempt != task["attempt"]:  # a handed-back attempt stopped part-way
                assert indices == list(range(len(indices))), steps
                assert len(indices) <= STEPS, steps
        lost = _sql(url, "SELECT lost_attempts FROM tasks WHERE id = $1", task["id"])
        assert lost[0]["lost_attempts"] == 0
        if task["attempt"] > 1:
            handed_back += 1
            # Begun on the old worker, ended on the new (the old one may have taken it after
            # `on_old` was read and before its SIGTERM).
            assert (runs[0][1], runs[-1][1]) == ("old", "new"), runs
    assert on_old, "the old worker was mid-batch when it was stopped"
    assert handed_back >= 1, "a task ran past the old worker's grace and moved to the new one"
    assert {worker for t in ids for _, worker in started_by(url, t)} == {"old", "new"}


def _begun_on(client: Any, database_url: str, task_id: str) -> str | None:
    """The worker running the task now if its current attempt has stored at most one step
    (three or more to go, each `delay_s` long), else None."""
    worker = _running_on(client, database_url, task_id)
    if worker is None:
        return None
    steps = step_indices(database_url, task_id)
    return worker if len(steps.get(max(steps, default=1), [])) <= 1 else None


def _running_on(client: Any, database_url: str, task_id: str) -> str | None:
    """The worker running the task now, or None."""
    if client.get(f"/v1/tasks/{task_id}").json()["status"] != "running":
        return None
    runs = started_by(database_url, task_id)
    return runs[-1][1] if runs else None
