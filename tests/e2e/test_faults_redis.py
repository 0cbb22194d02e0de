"""Fault 3: Redis restarts without persistence while tasks are queued and running.

Invariant 1: every accepted task still ends with its right result. Running
attempts carry on (their leases are taken back), queued tasks and a task
accepted while Redis was down are enqueued again by reconciliation from Postgres.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.e2e.fault_harness import (
    ContainerWatch,
    check_consistency,
    cluster_with_api,
    fault_settings,
    submit,
    wait_terminal,
    wait_until,
)
from tests.support.private_redis import PrivateRedis

TASKS = 5


def echo_script(delay_s: float) -> Script:
    """Two slow steps, then write the task's own marker (from the prompt) as the answer."""
    return Script(
        turns=[
            Turn(tool="execute_bash", arguments={"command": "echo one"}, delay_s=delay_s),
            Turn(tool="execute_bash", arguments={"command": "echo two"}, delay_s=delay_s),
            Turn(
                tool="execute_bash",
                arguments={
                    "command": "grep -o 'marker-[0-9]*' input/prompt.txt > output/answer.txt"
                },
            ),
            Turn(tool="submit", arguments={}),
        ]
    )


def submit_marked(client: httpx.Client, model: str, number: int) -> str:
    """A task whose right answer is its own marker, carried in an input file."""
    return submit(
        client,
        model,
        input_files=[{"path": "prompt.txt", "content_base64": _b64(f"marker-{number}\n")}],
    )


def _b64(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()


def test_redis_restart_without_persistence_loses_no_task(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    scripted_llm.add_script("fault-redis", echo_script(delay_s=1.0))
    config = fault_settings(settings, private_redis.url)
    with (
        cluster_with_api(config, tmp_path) as (procs, client),
        ContainerWatch(config.instance_name()) as watch,
    ):
        procs.start_worker("survivor")
        ids = {submit_marked(client, "fault-redis", n): n for n in range(TASKS)}

        def two_running() -> bool:
            states = [client.get(f"/v1/tasks/{i}").json()["status"] for i in ids]
            return states.count("running") == 2 and states.count("queued") == TASKS - 2

        wait_until("two running and the rest queued", two_running, 60)
        private_redis.client().set("sandhive-test:before-the-restart", "1")
        private_redis.kill()
        # Accepted while Redis is down: committed, but never enqueued by the API.
        ids[submit_marked(client, "fault-redis", TASKS)] = TASKS
        time.sleep(1.0)
        private_redis.start()
        # Not dbsize() == 0: the surviving worker writes its heartbeat within milliseconds.
        assert not private_redis.client().exists("sandhive-test:before-the-restart"), (
            "the restarted Redis starts empty"
        )

        for task_id, number in ids.items():
            task = wait_terminal(client, task_id, timeout_s=120)
            assert (task["status"], task["finish_reason"]) == ("succeeded", "submitted"), (
                procs.logs()
            )
            assert task["answer"].strip() == f"marker-{number}"
            # Running attempts survived the restart: no attempt was wasted.
            assert task["attempt"] == 1
    watch.assert_one_at_a_time()
    check_consistency(config, list(ids), private_redis.client())
