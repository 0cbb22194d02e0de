"""Fault 8: 200 tasks submitted at once against 2 workers with small concurrency.

The workers run while the tasks arrive, so admission and claiming overlap. The
queue depth limit (well below 200) answers 429 with Retry-After whenever the
backlog reaches it; the clients retry after it, and every task completes
exactly once (one attempt, one model call, never two sandboxes at once, never
more sandboxes than slots). Prints how long it took.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path

import httpx

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
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
QUEUE_MAX_DEPTH = 40
"""Well below TASKS: the queue fills while the workers run, so admission says 429 for real."""
RETRY_AFTER_S = 2


async def submit_all(
    base_url: str, count: int
) -> tuple[list[httpx.Response], list[httpx.Response]]:
    """`count` submissions at once (SUBMITTERS in flight at a time), each retried after a 429
    as its Retry-After says: (the accepted responses, every 429 seen)."""
    gate = asyncio.Semaphore(SUBMITTERS)
    refused: list[httpx.Response] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:

        async def one(number: int) -> httpx.Response:
            body = {"prompt": f"task {number}", "llm": {"model": "fault-load"}}
            while True:
                async with gate:
                    response = await client.post("/v1/tasks", json=body)
                if response.status_code != 429:
                    return response
                refused.append(response)
                await asyncio.sleep(int(response.headers["Retry-After"]))

        accepted = await asyncio.gather(*(one(n) for n in range(count)))
    return accepted, refused


def test_200_tasks_two_workers_all_complete_once(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    scripted_llm.add_script("fault-load", Script(turns=[Turn(tool="submit", arguments={})]))
    config = fault_settings(
        settings,
        private_redis.url,
        worker_concurrency=SLOTS,
        queue_max_depth=QUEUE_MAX_DEPTH,
        backpressure_retry_after_s=RETRY_AFTER_S,
    )
    with (
        cluster_with_api(config, tmp_path) as (procs, client),
        ContainerWatch(config.instance_name(), interval_s=0.5) as watch,
    ):
        for n in range(WORKERS):  # claiming runs alongside admission
            procs.start_worker(f"loader-{n}")
        for n in range(WORKERS):
            log = tmp_path / f"loader-{n}.log"
            wait_until(f"worker {n} to be ready", lambda f=log: "ready with" in f.read_text(), 60)

        started = time.monotonic()
        responses, refused = asyncio.run(submit_all(procs.base_url, TASKS))
        assert [r.status_code for r in responses] == [202] * TASKS
        ids = [r.json()["id"] for r in responses]
        assert len(set(ids)) == TASKS

        assert refused, "the queue limit was never reached"
        for over in refused:
            assert over.headers["Retry-After"] == str(RETRY_AFTER_S)
            error = over.json()["error"]
            assert error["code"] == "too_many_requests"
            assert error["details"] == {"limit": "queue_max_depth", "value": QUEUE_MAX_DEPTH}

        def all_done() -> bool:
            page = client.get("/v1/tasks", params={"status": "succeeded", "limit": 1}).json()
            left = [
                client.get("/v1/tasks", params={"status": s, "limit": 1}).json()["items"]
                for s in ("queued", "running")
            ]
            return bool(page["items"]) and not any(left)

        wait_until("every task to finish", all_done, 300, interval_s=1.0)
        took = time.monotonic() - started
        last_in = max(datetime.fromisoformat(r.json()["created_at"]) for r in responses)
        first_out = min(
            datetime.fromisoformat(client.get(f"/v1/tasks/{task_id}").json()["finished_at"])
            for task_id in ids
        )
        assert first_out < last_in, "tasks finished while others were still being admitted"
        print(
            f"{TASKS} tasks on {WORKERS}x{SLOTS} slots: {took:.1f} s ({TASKS / took:.2f}/s),"
            f" {len(refused)} submissions refused with 429 on the way"
        )

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
