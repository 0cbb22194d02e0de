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
from datetime import datetime
from pathlib import Path

from app.bus import keys
from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.e2e.fault_harness import (
    ContainerWatch,
    _sql,
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


def test_timeout_counts_only_the_time_attempts_ran(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    """`timeout_s` is one budget across a task's attempts, spent only while one runs
    (docs/operations.md, Reliability).

    Two tasks run a 4 s command, then lose their worker in a long one. Nobody runs them
    for longer than the short task's whole budget: that wait is the infrastructure's and
    is not charged, so neither ends `timeout` unstarted. Each runs attempt 2 with what
    attempt 1 left (charged from its start to the end of its last step) and ends `timeout`
    once that is spent, not a whole `timeout_s` after the rescue.
    """
    short_s, long_s = 14, 40
    markers = {name: f"deadline-{name}-{uuid.uuid4().hex[:8]}" for name in ("short", "long")}
    for name, marker in markers.items():
        command = f"python3 -c 'import time; time.sleep(600)' {marker}"
        scripted_llm.add_script(
            f"fault-deadline-{name}",
            Script(
                turns=[
                    Turn(tool="execute_bash", arguments={"command": "sleep 4"}),
                    Turn(tool="execute_bash", arguments={"command": command}),
                    Turn(tool="submit"),
                ],
                repeat_last=False,
            ),
        )
    config = fault_settings(settings, private_redis.url)
    with cluster_with_api(config, tmp_path) as (procs, client):
        doomed = procs.start_worker("doomed")
        limits = {"command_timeout_s": 900}
        short = submit(client, "fault-deadline-short", limits={**limits, "timeout_s": short_s})
        long = submit(client, "fault-deadline-long", limits={**limits, "timeout_s": long_s})
        for marker in markers.values():
            wait_until("both long commands to run", lambda m=marker: host_processes(m), 60)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=10)
        time.sleep(short_s + 2)  # longer than the short task's whole budget: not charged
        procs.start_worker("rescuer")

        ended = {short: wait_terminal(client, short, 90), long: wait_terminal(client, long, 120)}
        for task_id, limit in ((short, short_s), (long, long_s)):
            task = ended[task_id]
            assert (task["status"], task["finish_reason"]) == ("failed", "timeout"), procs.logs()
            assert task["error"] == f"task exceeded its timeout of {limit} s"
            assert task["attempt"] == 2, "the wait was not charged: it ran again"
            charged, second_start = attempt_times(config.database_url, task_id)
            assert 4 <= charged < 12, f"attempt 1 ran its 4 s command: {charged:.1f} s charged"
            ran = (datetime.fromisoformat(task["finished_at"]) - second_start).total_seconds()
            left = limit - charged
            assert left - 1 <= ran <= left + 8, f"attempt 2 ran {ran:.1f} s of {left:.1f} s left"
        for task_id in (short, long):
            wait_until(
                "the sandboxes to go", lambda t=task_id: not containers(f"sandhive.task={t}"), 60
            )
    assert scripted_llm.requests["fault-deadline-short"] >= 3, "attempt 2 called the model"
    check_consistency(config, [short, long], private_redis.client())


def attempt_times(database_url: str, task_id: str) -> tuple[float, datetime]:
    """What attempt 1 was charged (its start to the end of its last step, on its worker's
    clock), and when attempt 2 started."""
    rows = _sql(
        database_url,
        "SELECT (data->>'attempt')::int AS attempt, ts FROM events "
        "WHERE task_id = $1 AND type = 'task.started' ORDER BY seq",
        task_id,
    )
    starts = {r["attempt"]: r["ts"] for r in rows}
    [step_end] = _sql(
        database_url,
        "SELECT max(started_at + (llm_ms + tool_ms) * interval '1 millisecond') AS ended "
        "FROM steps WHERE task_id = $1 AND attempt = 1",
        task_id,
    )
    return (step_end["ended"] - starts[1]).total_seconds(), starts[2]


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
