"""Faults 1 and 2: a worker SIGKILLed mid-task, and one killed between claiming and starting.

Invariants 1, 2 and 4: the task still ends, as a new attempt in a new sandbox
(the dead attempt's steps kept and marked), the dead worker's sandbox is
removed within a minute, and no task ever has two sandboxes at once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from app.bus import keys
from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.e2e.fault_harness import (
    ContainerWatch,
    check_consistency,
    cluster_with_api,
    containers,
    db_events,
    fault_settings,
    host_processes,
    submit,
    wait_terminal,
    wait_until,
)
from tests.support.private_redis import PrivateRedis
from tests.support.processes import settings_env

ANSWER = "42"


def slow_script(delay_s: float) -> Script:
    """Three slow commands, then the answer and submit: long enough to be killed mid-way."""
    bash = [
        Turn(tool="execute_bash", arguments={"command": f"echo step{i}"}, delay_s=delay_s)
        for i in range(3)
    ]
    answer = Turn(
        tool="str_replace_editor",
        arguments={"command": "create", "path": "/testbed/output/answer.txt", "file_text": ANSWER},
    )
    return Script(turns=[*bash, answer, Turn(tool="submit", arguments={})])


def test_sigkilled_worker_task_completes_as_attempt_2(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    scripted_llm.add_script("fault-kill-mid", slow_script(delay_s=1.0))
    config = fault_settings(settings, private_redis.url)
    with (
        cluster_with_api(config, tmp_path) as (procs, client),
        ContainerWatch(config.instance_name()) as watch,
    ):
        doomed = procs.start_worker("doomed")
        task_id = submit(client, "fault-kill-mid")

        def steps_of_attempt_1() -> bool:
            steps = client.get(f"/v1/tasks/{task_id}/trajectory").json()["steps"]
            return any(step["attempt"] == 1 for step in steps)

        wait_until("a step of attempt 1", steps_of_attempt_1, 60)
        assert containers(f"sandhive.task={task_id}"), "attempt 1 has a sandbox while it runs"
        doomed.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        doomed.wait(timeout=10)
        procs.start_worker("rescuer")

        task = wait_terminal(client, task_id, timeout_s=90)
        assert (task["status"], task["finish_reason"]) == ("succeeded", "submitted"), procs.logs()
        assert task["attempt"] == 2
        assert task["answer"] == ANSWER

        # The dead attempt's sandbox goes within a minute of its worker's death (invariant 4).
        wait_until(
            "the dead attempt's sandbox to go",
            lambda: not containers(f"sandhive.task={task_id}"),
            60 - (time.monotonic() - killed_at),
        )

        steps = client.get(f"/v1/tasks/{task_id}/trajectory").json()["steps"]
        first = [s["index"] for s in steps if s["attempt"] == 1]
        second = [s for s in steps if s["attempt"] == 2]
        assert first, "attempt 1's steps are kept"
        assert first == list(range(len(first))), "in order"
        assert [s["attempt"] for s in steps] == sorted(s["attempt"] for s in steps), "not mixed"
        assert [s["index"] for s in second] == [0, 1, 2, 3, 4]
        assert second[-1]["action"]["tool"] == "submit"
        only_second = client.get(f"/v1/tasks/{task_id}/trajectory", params={"attempt": 2}).json()
        assert only_second["steps"] == second

    started = [
        e["data"] for e in db_events(config.database_url, task_id) if e["type"] == "task.started"
    ]
    assert [(s["attempt"], s["worker"]) for s in started] == [(1, "doomed"), (2, "rescuer")]
    assert started[1]["previous_attempt_lost"] is True
    watch.assert_one_at_a_time()
    check_consistency(config, [task_id], private_redis.client())


CLAIM_AND_DIE = """
import asyncio, sys
from redis.asyncio import Redis
from app.bus import queue
from app.worker import taking
from app.worker.pool import CLAIM_BLOCK_MS

async def main() -> None:
    redis = Redis.from_url(sys.argv[1])
    await queue.ensure_group(redis)
    lease_ms = int(float(sys.argv[2]) * 1000)
    taken = None
    while taken is None:  # what the worker's claim loop calls, with the worker's arguments
        taken = await taking.take(
            redis, "claimer", lease_ms=lease_ms, reclaim=True, block_ms=CLAIM_BLOCK_MS
        )
    print(taken.task_id, taken.holder, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""
"""Runs the worker's claim-and-lease step (`app.worker.taking.take`), then waits to die."""


def test_worker_killed_between_claim_and_start(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    """A process runs the worker's claim-and-lease step (`taking.take`), then is SIGKILLed."""
    scripted_llm.add_script("fault-kill-claimed", slow_script(delay_s=0.0))
    config = fault_settings(settings, private_redis.url)
    with cluster_with_api(config, tmp_path) as (procs, client):
        task_id = submit(client, "fault-kill-claimed")
        claimer = subprocess.Popen(
            [sys.executable, "-c", CLAIM_AND_DIE, private_redis.url, str(config.worker_lease_s)],
            env=settings_env(config),
            stdout=subprocess.PIPE,
        )
        try:
            assert claimer.stdout is not None
            printed = claimer.stdout.readline().decode().split()
            assert printed[0] == task_id
            lease = private_redis.client().get(keys.task_lease(task_id))
            assert lease is not None
            assert lease.decode() == printed[1], "the dead claimer holds the lease"
        finally:
            claimer.send_signal(signal.SIGKILL)
            claimer.wait(timeout=10)
            if claimer.stdout is not None:
                claimer.stdout.close()
        pending = private_redis.client().xpending("sandhive:tasks", "workers")
        assert pending["pending"] == 1
        assert client.get(f"/v1/tasks/{task_id}").json()["status"] == "queued"

        procs.start_worker("rescuer")
        task = wait_terminal(client, task_id, timeout_s=60)
        assert (task["status"], task["finish_reason"]) == ("succeeded", "submitted"), procs.logs()
        assert task["attempt"] == 1, "a claim that never started is not a lost attempt"
        assert task["answer"] == ANSWER
        rescuer_log = (tmp_path / "rescuer.log").read_text(errors="replace")
        assert f"reclaimed {task_id}" in rescuer_log, (
            "taken over once the dead claim's lease expired"
        )
    check_consistency(config, [task_id], private_redis.client())


def test_a_paused_worker_cannot_overwrite_the_new_attempt(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    """SIGSTOP (a GC pause, a partition) until the task is re-run elsewhere, then SIGCONT.

    The woken worker's writes are fenced off by the attempt number; the task
    keeps the new attempt's result and the old worker carries on, healthy.
    """
    scripted_llm.add_script("fault-pause", slow_script(delay_s=1.0))
    config = fault_settings(settings, private_redis.url)
    with (
        cluster_with_api(config, tmp_path) as (procs, client),
        ContainerWatch(config.instance_name()) as watch,
    ):
        paused = procs.start_worker("paused")
        task_id = submit(client, "fault-pause")

        def attempt_steps(attempt: int) -> list[dict]:
            steps = client.get(f"/v1/tasks/{task_id}/trajectory").json()["steps"]
            return [s for s in steps if s["attempt"] == attempt]

        wait_until("a step of attempt 1", lambda: attempt_steps(1), 60)
        paused.send_signal(signal.SIGSTOP)
        before = attempt_steps(1)
        procs.start_worker("rescuer")
        wait_until("attempt 2 to run", lambda: attempt_steps(2), 60)
        paused.send_signal(signal.SIGCONT)  # wakes while attempt 2 runs

        task = wait_terminal(client, task_id, timeout_s=90)
        time.sleep(3)  # let the woken worker try whatever it still wanted to write
        final = client.get(f"/v1/tasks/{task_id}").json()
        assert (final["status"], final["attempt"]) == ("succeeded", 2), procs.logs()
        assert final == task, "nothing changed after the end"
        assert attempt_steps(1) == before, "the stale attempt wrote no step after its pause"
        assert paused.poll() is None, "the woken worker is still alive"
    watch.assert_one_at_a_time()
    check_consistency(config, [task_id], private_redis.client())


def test_timeout_counts_from_the_first_attempt(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    """`timeout_s` is the task's wall clock, not each attempt's (docs/operations.md, Reliability).

    Two tasks lose their worker in a long command. The one whose deadline passed
    while nobody ran it ends `timeout` without a second attempt; the other runs
    attempt 2 with only what is left and ends `timeout` at first start + timeout_s,
    not a whole timeout_s after the rescue.
    """
    # Both commands must run before the short deadline; attempt 2 of the long task must
    # start (rescuer start-up, lease expiry, reclaim, a new sandbox) well before the long one.
    short_s, long_s = 10, 40
    markers = {name: f"deadline-{name}-{uuid.uuid4().hex[:8]}" for name in ("short", "long")}
    for name, marker in markers.items():
        command = f"python3 -c 'import time; time.sleep(600)' {marker}"
        scripted_llm.add_script(
            f"fault-deadline-{name}",
            Script(
                turns=[
                    Turn(tool="execute_bash", arguments={"command": command}),
                    Turn(tool="submit"),
                ]
            ),
        )
    config = fault_settings(settings, private_redis.url)
    with cluster_with_api(config, tmp_path) as (procs, client):
        doomed = procs.start_worker("doomed")
        limits = {"command_timeout_s": 900}
        short = submit(client, "fault-deadline-short", limits={**limits, "timeout_s": short_s})
        long = submit(client, "fault-deadline-long", limits={**limits, "timeout_s": long_s})
        for marker in markers.values():
            wait_until("both commands to run", lambda m=marker: host_processes(m), 60)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=10)
        first_start = datetime.fromisoformat(client.get(f"/v1/tasks/{short}").json()["started_at"])
        # Rescue only once the short task's wall clock is spent.
        time.sleep(max((first_start - datetime.now(UTC)).total_seconds() + short_s + 1, 0))
        procs.start_worker("rescuer")

        ended_short = wait_terminal(client, short, timeout_s=60)
        ended_long = wait_terminal(client, long, timeout_s=90)
        for task, limit in ((ended_short, short_s), (ended_long, long_s)):
            assert (task["status"], task["finish_reason"]) == ("failed", "timeout"), procs.logs()
            assert task["error"] == f"task exceeded its timeout of {limit} s"
        assert ended_short["attempt"] == 1, "no attempt starts once the task's time is spent"
        assert ended_long["attempt"] == 2, "the long task had time left: it ran again"
        took = _seconds(ended_long["started_at"], ended_long["finished_at"])
        # A whole long_s from the rescue (after short_s + 1) would be past long_s + 11.
        assert long_s - 1 <= took <= long_s + 8, f"ended {took:.1f} s after its first start"
        for task_id in (short, long):
            wait_until(
                "the sandboxes to go", lambda t=task_id: not containers(f"sandhive.task={t}"), 60
            )
    started = {
        task_id: [
            e["data"]["attempt"]
            for e in db_events(config.database_url, task_id)
            if e["type"] == "task.started"
        ]
        for task_id in (short, long)
    }
    assert started == {short: [1], long: [1, 2]}
    assert scripted_llm.requests["fault-deadline-short"] == 1, "attempt 2 never called the model"
    check_consistency(config, [short, long], private_redis.client())


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
