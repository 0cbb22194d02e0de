"""A worker SIGKILLed mid-task that no worker ever replaces: its sandbox still goes.

Nothing of Sandhive is left to remove it (no worker of the instance, so no reaper):
the sandbox's own deadline (its task's timeout_s + artifact_collect_grace_s +
sandbox_deadline_grace_s from its start) ends the container, and Docker removes it and
its workdir volume.
"""

from __future__ import annotations

import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.e2e.fault_harness import (
    cluster_with_api,
    containers,
    containers_left,
    fault_settings,
    submit,
    wait_terminal,
    wait_until,
)
from tests.support.docker_objects import docker_inspect
from tests.support.private_redis import PrivateRedis

TIMEOUT_S, COLLECT_GRACE_S, DEADLINE_GRACE_S = 8, 1.0, 2.0
DEADLINE_S = TIMEOUT_S + COLLECT_GRACE_S + DEADLINE_GRACE_S


def test_a_dead_workers_sandbox_and_volume_go_at_their_deadline(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    # Slow steps, more than TIMEOUT_S of them: no attempt can finish.
    endless = [
        Turn(tool="execute_bash", arguments={"command": f"echo step{i}"}, delay_s=1.0)
        for i in range(30)
    ]
    scripted_llm.add_script("fault-deadline-abandoned", Script(turns=endless))
    config = fault_settings(
        settings,
        private_redis.url,
        artifact_collect_grace_s=COLLECT_GRACE_S,
        sandbox_deadline_grace_s=DEADLINE_GRACE_S,
    )
    with cluster_with_api(config, tmp_path) as (procs, client):
        doomed = procs.start_worker("doomed")
        task_id = submit(client, "fault-deadline-abandoned", limits={"timeout_s": TIMEOUT_S})

        def steps_of_attempt_1() -> bool:
            steps = client.get(f"/v1/tasks/{task_id}/trajectory").json()["steps"]
            return any(step["attempt"] == 1 for step in steps)

        wait_until("a step of attempt 1", steps_of_attempt_1, 60)
        [container] = containers(f"sandhive.task={task_id}")
        info = docker_inspect("container", container)
        assert info is not None
        [volume] = [m["Name"] for m in info["Mounts"] if m["Destination"] == "/testbed"]
        started = datetime.fromisoformat(info["State"]["StartedAt"][:26].rstrip("Z") + "+00:00")
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=10)
        # No other worker starts: nothing of Sandhive is left to remove the sandbox.
        time.sleep(1)
        assert docker_inspect("container", container) is not None, "it outlives its worker"

        def gone() -> bool:
            return docker_inspect("container", container) is None

        left = DEADLINE_S + 15 - (datetime.now(UTC) - started).total_seconds()
        wait_until("the abandoned sandbox to end at its deadline", gone, left, 0.1)
        lived = (datetime.now(UTC) - started).total_seconds()
        assert lived >= DEADLINE_S - 0.5, f"gone after {lived:.1f} s, before its deadline"
        wait_until("its workdir volume to go", lambda: not docker_inspect("volume", volume), 10)

        # Only now does a worker come back. The wait was nobody's, so it is not charged:
        # attempt 2 runs with what attempt 1 left and ends `timeout` once that is spent.
        procs.start_worker("rescuer")
        task = wait_terminal(client, task_id, timeout_s=60 + TIMEOUT_S)
        assert (task["status"], task["finish_reason"]) == ("failed", "timeout"), procs.logs()
        assert task["attempt"] == 2
        assert containers_left(f"sandhive.task={task_id}") == []
        leftover = ["docker", "volume", "ls", "-q", "--filter", f"label=sandhive.task={task_id}"]
        assert subprocess.run(leftover, capture_output=True, text=True, check=True).stdout == ""
