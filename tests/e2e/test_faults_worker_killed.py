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
from pathlib import Path

from app.config import Settings
from app.llm.scripted import Script, ScriptedLLMServer, Turn
from tests.e2e.fault_harness import (
    ContainerWatch,
    check_consistency,
    cluster_with_api,
    containers,
    db_events,
    fault_settings,
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
from app.bus import leases, queue

async def main() -> None:
    redis = Redis.from_url(sys.argv[1])
    await queue.ensure_group(redis)
    claim = await queue.claim(redis, "claimer", block_ms=10_000)
    assert claim is not None
    holder = leases.holder_of("claimer", claim.message_id)
    lease_ms = int(float(sys.argv[2]) * 1000)
    assert await leases.acquire(redis, claim.task_id, holder, lease_ms) is None
    print(claim.task_id, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_worker_killed_between_claim_and_start(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    """A process does exactly what a worker does before starting an attempt, then dies."""
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
            assert claimer.stdout.readline().decode().strip() == task_id
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
