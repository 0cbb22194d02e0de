"""Fault 6: Postgres stops under a running API and worker, then comes back.

During the outage every call that needs the database answers 503
`database_unavailable` with Retry-After in the error shape: never a 500, and
never a 202 for a task that was not stored (invariant 1). A WebSocket is closed
with 1013 (try again later), an SSE request answered 503 before its stream
starts, and streams already open end cleanly. As soon as Postgres is back every
call answers normally on its first try (no burst of errors), the task caught
running ends terminal, and every task's `seq` has no gaps (invariant 3). The
server is a private one the test starts and stops (tests/support/private_postgres.py).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.api.conftest import assert_error
from tests.e2e.fault_harness import (
    Cluster,
    check_consistency,
    cluster_with_api,
    fault_settings,
    submit,
    wait_terminal,
    wait_until,
)
from tests.support.private_postgres import PrivatePostgres, running_postgres
from tests.support.private_redis import PrivateRedis

RETRY_AFTER_S = 7
"""Not the default, so the header is seen to come from the setting."""
IDEMPOTENCY_KEY = "submitted-during-the-outage"
MARKER = {"submitted": "during the outage"}
STREAM_END_S = 20.0
"""An open stream notices the outage at its next idle tick (keepalive 0.5 s here)."""
OUTAGE_S = 5.0
"""Down for longer than a worker lease (3 s here), however fast the checks run."""


@pytest.fixture
def private_postgres() -> Iterator[tuple[PrivatePostgres, str]]:
    """A private server with a migrated database of its own (its name is the instance)."""
    with running_postgres(f"sandhive_outage_{os.getpid()}") as (server, url):
        yield server, url


def quick_script() -> Script:
    """One command that leaves an artifact, then submit."""
    write = {"command": "echo 42 > output/answer.txt"}
    return Script(
        turns=[Turn(tool="execute_bash", arguments=write), Turn(tool="submit", arguments={})]
    )


def slow_script() -> Script:
    """Slow steps: still running when Postgres stops, and after it is back."""
    turns = [
        Turn(tool="execute_bash", arguments={"command": f"echo {i}"}, delay_s=1.0) for i in range(6)
    ]
    return Script(turns=[*turns, Turn(tool="submit", arguments={})])


def calls(task_id: str, artifact: str) -> list[tuple[str, str]]:
    """Every call that needs Postgres, on a finished task."""
    base = f"/v1/tasks/{task_id}"
    return [
        ("GET", "/v1/tasks"),
        ("GET", "/v1/tasks?status=succeeded&limit=5"),
        ("GET", base),
        ("GET", f"{base}/trajectory"),
        ("GET", f"{base}/trajectory?format=reference"),
        ("GET", f"{base}/artifacts"),
        ("GET", f"{base}/artifacts.zip"),
        ("GET", f"{base}/artifacts/{artifact}"),
        ("GET", f"{base}/events"),
        ("POST", f"{base}/cancel"),
        ("GET", "/metrics"),
    ]


def submission(model: str) -> dict[str, object]:
    return {"prompt": "compute", "llm": {"model": model}, "metadata": MARKER}


def assert_unavailable(response: httpx.Response) -> None:
    assert_error(response, 503, "database_unavailable")
    assert response.headers["retry-after"] == str(RETRY_AFTER_S), response.headers


async def until_closed(ws: websockets.ClientConnection) -> int | None:
    """Read a WebSocket to its end; the server's close code."""
    try:
        async for _ in ws:
            pass
    except websockets.ConnectionClosed:
        pass
    return ws.close_code


async def close_code(url: str) -> int | None:
    async with websockets.connect(url, open_timeout=10) as ws:
        return await until_closed(ws)


Ending = asyncio.Task[int | None]


async def open_streams(procs: Cluster, task_id: str) -> tuple[Ending, Ending]:
    """A WebSocket and an SSE viewer of the running task, each past its first event."""
    ws = await websockets.connect(f"{procs.ws_url}/v1/tasks/{task_id}/stream", open_timeout=10)
    await asyncio.wait_for(ws.recv(), 10)
    first = asyncio.Event()

    async def sse_end() -> int | None:
        """0 when the response ended cleanly, None when the connection broke."""
        timeout = httpx.Timeout(10, read=None)
        async with (
            httpx.AsyncClient(base_url=procs.base_url, timeout=timeout) as client,
            client.stream("GET", f"/v1/tasks/{task_id}/events") as response,
        ):
            assert response.status_code == 200, response.status_code
            try:
                async for line in response.aiter_lines():
                    if line.startswith("id:"):
                        first.set()
            except httpx.TransportError:
                return None
            return 0

    streams = (asyncio.create_task(until_closed(ws)), asyncio.create_task(sse_end()))
    await asyncio.wait_for(first.wait(), 10)
    return streams


async def during_outage(
    server: PrivatePostgres, procs: Cluster, running: str, done: str, artifact: str
) -> None:
    """Stop Postgres under open streams, check every call, and start it again."""
    ws_open, sse_open = await open_streams(procs, running)
    await asyncio.to_thread(server.stop)
    back_at = asyncio.get_running_loop().time() + OUTAGE_S
    async with httpx.AsyncClient(base_url=procs.base_url, timeout=10) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert_error(await client.get("/readyz"), 503, "not_ready")
        for method, path in calls(done, artifact):
            assert_unavailable(await client.request(method, path))
        posted = await client.post(
            "/v1/tasks",
            json=submission("pg-quick"),
            headers={"Idempotency-Key": IDEMPOTENCY_KEY},
        )
        assert_unavailable(posted)
        files = {"task": (None, json.dumps(submission("pg-quick")))}
        assert_unavailable(await client.post("/v1/tasks", files=files))
    assert await close_code(f"{procs.ws_url}/v1/tasks/{done}/stream") == 1013
    assert await asyncio.wait_for(ws_open, STREAM_END_S) == 1013, "an open WebSocket: 1013"
    assert await asyncio.wait_for(sse_open, STREAM_END_S) == 0, "an open SSE ends cleanly"
    await asyncio.sleep(back_at - asyncio.get_running_loop().time())
    await asyncio.to_thread(server.start)


def after_recovery(client: httpx.Client, done: str, artifact: str) -> str:
    """The very first call of each kind succeeds: no error burst while the pool heals.

    Returns the task the refused submission's retry (same Idempotency-Key) created.
    """
    expected = {f"/v1/tasks/{done}/cancel": 409}  # it is finished: a normal refusal
    for method, path in calls(done, artifact):
        response = client.request(method, path)
        assert response.status_code == expected.get(path, 200), (path, response.text)
    assert client.get("/readyz").status_code == 200
    stored = [t for t in client.get("/v1/tasks?limit=100").json()["items"] if t["metadata"]]
    assert stored == [], "a submission answered 503 was not stored"
    again = client.post(
        "/v1/tasks", json=submission("pg-quick"), headers={"Idempotency-Key": IDEMPOTENCY_KEY}
    )
    assert again.status_code == 202, "the key was never used: the first try stored nothing"
    return str(again.json()["id"])


def test_postgres_outage_answers_503_then_everything_recovers(
    settings: Settings,
    private_redis: PrivateRedis,
    private_postgres: tuple[PrivatePostgres, str],
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    server, url = private_postgres
    scripted_llm.add_script("pg-quick", quick_script())
    scripted_llm.add_script("pg-slow", slow_script())
    config = fault_settings(
        settings,
        private_redis.url,
        database_url=url,
        unavailable_retry_after_s=RETRY_AFTER_S,
        stream_keepalive_s=0.5,
    )
    with cluster_with_api(config, tmp_path) as (procs, client):
        procs.start_worker("outlasting")
        done = submit(client, "pg-quick")
        assert wait_terminal(client, done)["status"] == "succeeded", procs.logs()
        (artifact,) = [a["path"] for a in client.get(f"/v1/tasks/{done}/artifacts").json()["items"]]
        running = submit(client, "pg-slow")

        def is_running() -> bool:
            return bool(client.get(f"/v1/tasks/{running}").json()["status"] == "running")

        wait_until("the slow task to run", is_running, 60)
        asyncio.run(during_outage(server, procs, running, done, artifact))
        retried = after_recovery(client, done, artifact)
        caught = wait_terminal(client, running, timeout_s=120)
        # An attempt that lost Postgres is not the task's failure: it ran again.
        assert (caught["status"], caught["finish_reason"]) == ("succeeded", "submitted"), (
            caught,
            procs.logs(),
        )
        assert wait_terminal(client, retried)["status"] == "succeeded", procs.logs()
    check_consistency(config, [done, retried, running], private_redis.client())
