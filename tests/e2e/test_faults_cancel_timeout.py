"""Faults 5 and 6: cancelling (during an LLM call, a long command, while queued) and timeouts.

A cancelled task ends `cancelled` within seconds with its output so far kept,
its sandbox and every process in it gone; a queued one never starts. A task
past its `timeout_s` inside a command that ignores SIGTERM still ends
`timeout` on time, and the process is gone; a command past its own timeout
has its whole process tree killed inside the sandbox while the task goes on.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime
from pathlib import Path

import httpx

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.e2e.fault_harness import (
    ContainerWatch,
    check_consistency,
    cluster_with_api,
    containers_left,
    event_types,
    fault_settings,
    host_processes,
    submit,
    wait_terminal,
    wait_until,
)
from tests.support.private_redis import PrivateRedis

CANCEL_WITHIN_S = 10.0
""""Within a few seconds" (API.md): a liveness bound, generous for a loaded 2-core machine."""
IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def bash(command: str, **extra: object) -> Turn:
    return Turn(tool="execute_bash", arguments={"command": command}, **extra)  # type: ignore[arg-type]


def artifact_paths(client: httpx.Client, task_id: str) -> list[str]:
    return [a["path"] for a in client.get(f"/v1/tasks/{task_id}/artifacts").json()["items"]]


def cancel_and_wait(client: httpx.Client, task_id: str) -> tuple[dict, float]:
    """POST cancel (202 with the still-running task), then wait for the end; (task, seconds)."""
    asked = time.monotonic()
    response = client.post(f"/v1/tasks/{task_id}/cancel")
    assert response.status_code == 202, response.text
    assert response.json()["id"] == task_id
    task = wait_terminal(client, task_id, timeout_s=60)
    return task, time.monotonic() - asked


def test_cancel_during_llm_call_and_while_queued(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    scripted_llm.add_script(
        "fault-cancel-llm",
        Script(
            turns=[
                bash("echo partial > /testbed/output/partial.txt"),
                bash("echo never", delay_s=120),  # the model "thinks" for two minutes
                Turn(tool="submit", arguments={}),
            ]
        ),
    )
    scripted_llm.add_script("fault-cancel-queued", Script(turns=[Turn(tool="submit")]))
    config = fault_settings(settings, private_redis.url, worker_concurrency=1)
    with (
        cluster_with_api(config, tmp_path) as (procs, client),
        ContainerWatch(config.instance_name()) as watch,
    ):
        procs.start_worker("canceller")
        busy = submit(client, "fault-cancel-llm")
        queued = submit(client, "fault-cancel-queued")  # waits: the worker's only slot is busy
        wait_until(
            "the second LLM call of the running task",
            lambda: event_types(config.database_url, busy).count("step.started") == 2,
            60,
        )
        assert client.get(f"/v1/tasks/{queued}").json()["status"] == "queued"

        response = client.post(f"/v1/tasks/{queued}/cancel")
        assert response.status_code == 202, response.text
        assert (response.json()["status"], response.json()["finish_reason"]) == (
            "cancelled",
            "cancelled",
        )

        time.sleep(0.5)  # the LLM call is in flight
        task, took = cancel_and_wait(client, busy)
        assert (task["status"], task["finish_reason"]) == ("cancelled", "cancelled"), procs.logs()
        assert took < CANCEL_WITHIN_S, f"cancel took {took:.1f} s"
        assert artifact_paths(client, busy) == ["partial.txt"], "the output so far is kept"
        assert task["usage"]["steps"] == 1
        assert containers_left(f"sandhive.task={busy}") == []

        again = client.post(f"/v1/tasks/{busy}/cancel")
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "conflict"

        # The worker now takes the cancelled task's message, and must not start it.
        wait_until(
            "the queue to drain",
            lambda: private_redis.client().xlen("sandhive:tasks") == 0,
            30,
        )
        final = client.get(f"/v1/tasks/{queued}").json()
    assert (final["status"], final["attempt"]) == ("cancelled", 0)
    assert event_types(config.database_url, queued) == ["task.queued", "task.finished"]
    assert scripted_llm.requests.get("fault-cancel-queued", 0) == 0
    assert queued not in watch.seen, "a cancelled queued task never gets a sandbox"
    check_consistency(config, [busy, queued], private_redis.client())


def test_cancel_during_a_long_command(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    marker = f"cancel-marker-{uuid.uuid4().hex[:8]}"
    long_command = (
        "echo partial > /testbed/output/partial.txt && "
        f"python3 -c 'import time; time.sleep(600)' {marker}"
    )
    scripted_llm.add_script(
        "fault-cancel-command", Script(turns=[bash(long_command), Turn(tool="submit")])
    )
    config = fault_settings(settings, private_redis.url)
    with cluster_with_api(config, tmp_path) as (procs, client):
        procs.start_worker("canceller")
        task_id = submit(client, "fault-cancel-command", limits={"command_timeout_s": 900})
        wait_until("the long command to run", lambda: host_processes(marker), 60)

        task, took = cancel_and_wait(client, task_id)
        assert (task["status"], task["finish_reason"]) == ("cancelled", "cancelled"), procs.logs()
        assert took < CANCEL_WITHIN_S, f"cancel took {took:.1f} s"
        assert host_processes(marker) == [], "the command is gone"
        assert containers_left(f"sandhive.task={task_id}") == []
        assert artifact_paths(client, task_id) == ["partial.txt"]
    check_consistency(config, [task_id], private_redis.client())


def test_timeout_inside_a_command_that_ignores_sigterm(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    marker = f"timeout-marker-{uuid.uuid4().hex[:8]}"
    command = f'echo started > /testbed/output/started.txt && python3 -c "{IGNORE_TERM}" {marker}'
    scripted_llm.add_script("fault-timeout", Script(turns=[bash(command), Turn(tool="submit")]))
    config = fault_settings(settings, private_redis.url)
    timeout_s = 8
    with cluster_with_api(config, tmp_path) as (procs, client):
        procs.start_worker("timer")
        task_id = submit(
            client, "fault-timeout", limits={"timeout_s": timeout_s, "command_timeout_s": 900}
        )
        wait_until("the command to run", lambda: host_processes(marker), 60)
        task = wait_terminal(client, task_id, timeout_s=60)
        assert host_processes(marker) == [], "the SIGTERM-ignoring process is gone"
        assert (task["status"], task["finish_reason"]) == ("failed", "timeout"), procs.logs()
        assert "timeout" in task["error"]
        took = _seconds(task["started_at"], task["finished_at"])
        assert took <= timeout_s + 10, f"ended {took:.1f} s after it started"
        assert containers_left(f"sandhive.task={task_id}") == []
        assert artifact_paths(client, task_id) == ["started.txt"], "partial output is kept"
    check_consistency(config, [task_id], private_redis.client())


BIG_FILES = 16
BIG_FILE_MIB = 64
"""1 GiB of output, sparse (no RAM in the sandbox): 3.5-4 s to collect, uncompressed, on an
idle 2-core host (about 270 MiB/s through Docker's archive API), longer under load: well past
COLLECT_GRACE_S and the at most 2 s of wall clock the collection starts with."""
COLLECT_GRACE_S = 1.0
"""`artifact_collect_grace_s` for that test: small, so a little data outlasts it."""
# The sandbox's age in seconds, to the tick: now minus its PID 1's start (both since boot).
SANDBOX_AGE = (
    "import os; t = float(open('/proc/uptime').read().split()[0]); "
    "start = int(open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19]); "
    "print(t - start / os.sysconf('SC_CLK_TCK'))"
)


def test_timeout_during_artifact_collection(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    """The agent submits just before its timeout_s; collecting its (large) output runs past it.

    Collection gets what is left of the wall clock, at least its grace, and
    no more: the task ends `timeout` on time, its sandbox is gone, nothing half
    collected is stored.
    """
    timeout_s = 16
    # Sleep until the sandbox (whose PID 1 started with the attempt, after the deadline did)
    # is 2 s short of the deadline, however slow the start was: the collection begins with
    # less than 2 s of the wall clock left and gets that or its grace, whichever is longer.
    until = timeout_s - 2
    make_output = (
        f"cd /testbed/output && for i in $(seq 1 {BIG_FILES}); do "
        f"truncate -s {BIG_FILE_MIB}M big$i.bin; done; "
        f'age=$(python3 -c "{SANDBOX_AGE}"); '
        f'sleep $(python3 -c "print(max(0.0, {until} - $age))")'
    )
    scripted_llm.add_script(
        "fault-collect-timeout", Script(turns=[bash(make_output), Turn(tool="submit")])
    )
    # Every file is within the caps, so collection has to read all of them.
    config = fault_settings(
        settings,
        private_redis.url,
        artifact_collect_grace_s=COLLECT_GRACE_S,
        artifact_max_file_bytes=BIG_FILE_MIB * 2**20,
        artifact_max_total_bytes=2 * BIG_FILES * BIG_FILE_MIB * 2**20,
    )
    with cluster_with_api(config, tmp_path) as (procs, client):
        procs.start_worker("collector")
        task_id = submit(
            client,
            "fault-collect-timeout",
            limits={"timeout_s": timeout_s, "command_timeout_s": 60},
        )
        task = wait_terminal(client, task_id, timeout_s=90)
        assert (task["status"], task["finish_reason"]) == ("failed", "timeout"), procs.logs()
        assert task["error"] == f"task exceeded its timeout of {timeout_s} s"
        steps = client.get(f"/v1/tasks/{task_id}/trajectory").json()["steps"]
        assert [s["action"]["tool"] for s in steps] == ["execute_bash", "submit"], (
            "the agent finished in time: the timeout hit during the collection"
        )
        took = _seconds(task["started_at"], task["finished_at"])
        assert took <= timeout_s + COLLECT_GRACE_S + 4, f"ended {took:.1f} s after it started"
        assert artifact_paths(client, task_id) == [], "a cut collection stores nothing"
        assert containers_left(f"sandhive.task={task_id}") == []
    check_consistency(config, [task_id], private_redis.client())


def test_command_timeout_kills_the_whole_tree_inside_the_sandbox(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    """A command and the child it forked both ignore SIGTERM; at its timeout both are killed."""
    mark = f"tree{uuid.uuid4().hex[:6]}"
    stubborn = f'python3 -c "{IGNORE_TERM}" {mark}'
    # [x] in the pattern keeps grep from matching its own command line.
    survivors = f"grep -ls '{mark[:-1]}[{mark[-1]}]' /proc/[0-9]*/cmdline || echo none-left"
    scripted_llm.add_script(
        "fault-command-timeout",
        Script(
            turns=[
                bash(f"({stubborn} &) ; {stubborn}"),
                bash(survivors, expect="The command took too long"),
                Turn(tool="submit", expect="none-left"),
            ]
        ),
    )
    config = fault_settings(settings, private_redis.url)
    with cluster_with_api(config, tmp_path) as (procs, client):
        procs.start_worker("timer")
        task_id = submit(client, "fault-command-timeout", limits={"command_timeout_s": 3})
        task = wait_terminal(client, task_id, timeout_s=60)
    assert (task["status"], task["finish_reason"]) == ("succeeded", "submitted"), procs.logs()
    assert scripted_llm.failures == []
    check_consistency(config, [task_id], private_redis.client())


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
