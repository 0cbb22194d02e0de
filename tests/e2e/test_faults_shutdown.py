"""Fault 7: SIGTERM to a worker with running tasks.

It claims nothing more; its running tasks finish within the grace period, or,
past it, are handed back and run again elsewhere as a new attempt that does
not count as lost (the test sets `worker_max_attempts=1`, so a wasted attempt
would fail the task `worker_lost`). No task is lost or runs twice at once.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.e2e.fault_harness import (
    ContainerWatch,
    check_consistency,
    cluster_with_api,
    containers_left,
    db_events,
    fault_settings,
    submit,
    wait_terminal,
    wait_until,
)
from tests.support.private_redis import PrivateRedis


def slow_script(steps: int, delay_s: float) -> Script:
    turns = [
        Turn(tool="execute_bash", arguments={"command": f"echo {i}"}, delay_s=delay_s)
        for i in range(steps)
    ]
    return Script(turns=[*turns, Turn(tool="submit", arguments={})])


def statuses(client: httpx.Client, ids: list[str]) -> list[str]:
    return [client.get(f"/v1/tasks/{task_id}").json()["status"] for task_id in ids]


def started_by(settings: Settings, task_id: str) -> list[tuple[int, str]]:
    events = db_events(settings.database_url, task_id)
    return [
        (e["data"]["attempt"], e["data"]["worker"]) for e in events if e["type"] == "task.started"
    ]


def steps_done(settings: Settings, task_id: str) -> int:
    return sum(e["type"] == "step.completed" for e in db_events(settings.database_url, task_id))


def test_sigterm_lets_running_tasks_finish_and_claims_nothing_new(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    scripted_llm.add_script("fault-drain", slow_script(steps=3, delay_s=1.0))
    config = fault_settings(settings, private_redis.url, worker_shutdown_grace_s=30.0)
    with cluster_with_api(config, tmp_path) as (procs, client):
        leaving = procs.start_worker("leaving")
        running = [submit(client, "fault-drain") for _ in range(2)]
        wait_until("both to run", lambda: statuses(client, running) == ["running"] * 2, 60)
        waiting = [submit(client, "fault-drain") for _ in range(2)]
        wait_until("a step of each", lambda: all(steps_done(config, t) for t in running), 60)

        leaving.send_signal(signal.SIGTERM)
        assert leaving.wait(timeout=config.worker_shutdown_grace_s + 5) == 0, procs.logs()
        for task_id in running:
            task = client.get(f"/v1/tasks/{task_id}").json()
            assert (task["status"], task["attempt"]) == ("succeeded", 1), procs.logs()
        assert statuses(client, waiting) == ["queued"] * 2, "nothing claimed after SIGTERM"

        procs.start_worker("staying")
        for task_id in waiting:
            assert wait_terminal(client, task_id)["status"] == "succeeded"
    assert [started_by(config, t) for t in running] == [[(1, "leaving")]] * 2
    assert [started_by(config, t) for t in waiting] == [[(1, "staying")]] * 2
    check_consistency(config, running + waiting, private_redis.client())


def test_sigterm_past_the_grace_hands_tasks_back_without_losing_an_attempt(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    scripted_llm.add_script("fault-handback", slow_script(steps=6, delay_s=1.0))
    config = fault_settings(
        settings, private_redis.url, worker_shutdown_grace_s=1.0, worker_max_attempts=1
    )
    with (
        cluster_with_api(config, tmp_path) as (procs, client),
        ContainerWatch(config.instance_name()) as watch,
    ):
        leaving = procs.start_worker("leaving")
        ids = [submit(client, "fault-handback") for _ in range(2)]
        wait_until("a step of each", lambda: all(steps_done(config, t) for t in ids), 60)

        signalled = time.monotonic()
        leaving.send_signal(signal.SIGTERM)
        assert leaving.wait(timeout=config.worker_shutdown_grace_s + 15) == 0, procs.logs()
        print(f"worker exited {time.monotonic() - signalled:.1f} s after SIGTERM")
        assert statuses(client, ids) == ["queued"] * 2, "handed back, not left running"
        for task_id in ids:
            assert containers_left(f"sandhive.task={task_id}") == [], "its sandbox went with it"
            types = [e["type"] for e in db_events(config.database_url, task_id)]
            assert types[-1] == "task.queued", types

        procs.start_worker("staying")
        for task_id in ids:
            task = wait_terminal(client, task_id)
            assert (task["status"], task["finish_reason"]) == ("succeeded", "submitted"), (
                procs.logs()
            )
            assert task["attempt"] == 2
    for task_id in ids:
        assert started_by(config, task_id) == [(1, "leaving"), (2, "staying")]
        handed = [e for e in db_events(config.database_url, task_id) if e["type"] == "task.queued"]
        assert [e["data"].get("reason") for e in handed] == [None, "handed back"]
    watch.assert_one_at_a_time()
    check_consistency(config, ids, private_redis.client())
