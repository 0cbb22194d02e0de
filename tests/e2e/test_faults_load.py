"""Fault 8: 200 tasks submitted at once against 2 workers with small concurrency.

Every accepted task completes exactly once (one attempt, one model call, never
two sandboxes at once, never more sandboxes than slots), and the queue depth
limit answers 429 with Retry-After once exceeded. Prints how long it took.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from app.config import Settings
from app.llm.scripted import Script, ScriptedLLMServer, Turn
from tests.e2e.fault_harness import (
    ContainerWatch,
    check_consistency,
    cluster_with_api,
    events_by_task,
    fault_settings,
    wait_until,
)
from tests.support.private_redis import PrivateRedis

TASKS = 200
WORKERS = 2
SLOTS = 2
SUBMITTERS = 20


async def submit_all(base_url: str, count: int) -> list[httpx.Response]:
    """`count` submissions at once (SUBMITTERS in flight at a time)."""
    gate = asyncio.Semaphore(SUBMITTERS)
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:

        async def one(number: int) -> httpx.Response:
            async with gate:
                body = {"prompt": f"task {number}", "llm": {"model": "fault-load"}}
                return await client.post("/v1/tasks", json=body)

        return await asyncio.gather(*(one(n) for n in range(count)))


def test_200_tasks_two_workers_all_complete_once(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    scripted_llm.add_script("fault-load", Script(turns=[Turn(tool="submit", arguments={})]))
    config = fault_settings(
        settings, private_redis.url, worker_concurrency=SLOTS, queue_max_depth=TASKS
    )
    with (
        cluster_with_api(config, tmp_path) as (procs, client),
        ContainerWatch(config.instance_name(), interval_s=0.5) as watch,
    ):
        responses = asyncio.run(submit_all(procs.base_url, TASKS))
        assert [r.status_code for r in responses] == [202] * TASKS
        ids = [r.json()["id"] for r in responses]
        assert len(set(ids)) == TASKS

        over = client.post("/v1/tasks", json={"prompt": "one too many"})
        assert over.status_code == 429, over.text
        assert int(over.headers["Retry-After"]) == config.backpressure_retry_after_s
        assert over.json()["error"]["code"] == "too_many_requests"

        started = time.monotonic()
        for n in range(WORKERS):
            procs.start_worker(f"loader-{n}")

        def all_done() -> bool:
            page = client.get("/v1/tasks", params={"status": "succeeded", "limit": 1}).json()
            left = [
                client.get("/v1/tasks", params={"status": s, "limit": 1}).json()["items"]
                for s in ("queued", "running")
            ]
            return bool(page["items"]) and not any(left)

        wait_until("every task to finish", all_done, 300, interval_s=1.0)
        took = time.monotonic() - started
        print(f"{TASKS} tasks on {WORKERS}x{SLOTS} slots: {took:.1f} s ({TASKS / took:.2f}/s)")
        # The limit counts waiting tasks: with the queue drained, submissions are accepted again.
        again = client.post("/v1/tasks", json={"prompt": "again", "llm": {"model": "fault-load"}})
        assert again.status_code == 202, again.text
        ids.append(again.json()["id"])
        wait_until("the last task", all_done, 60)

    for events in events_by_task(config.database_url, ids).values():
        finished = events[-1]["data"]
        assert (finished["status"], finished["finish_reason"]) == ("succeeded", "submitted")
        assert [e["data"]["attempt"] for e in events if e["type"] == "task.started"] == [1]
    assert scripted_llm.requests["fault-load"] == len(ids), (
        "one model call per task: none ran twice"
    )
    watch.assert_one_at_a_time()
    assert watch.max_total <= WORKERS * SLOTS
    check_consistency(config, ids, private_redis.client())
