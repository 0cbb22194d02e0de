"""Connection-level limits (RELIABILITY A-40): slowloris and silent sockets, the connection
cap, the per-tenant stream cap across API processes, and the WebSocket message cap.

Everything runs through the uvicorn configuration `sandhive serve` uses
(`app.api.server.server_options`), in the test's loop, and once through a real
`sandhive serve` subprocess to prove the command wires it in.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from redis.asyncio import Redis
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import InvalidStatus

from app.api.server import WS_MAX_SIZE, server_options
from app.api.streamcap import SLOT_TTL_FACTOR, refresh_every_s
from app.bus import streamslots
from app.config import Settings
from app.db.engine import Sessions
from tests.api.conftest import assert_error
from tests.api.live_server import live_server
from tests.security.api_process import running_api
from tests.security.conftest import ADMIN_KEY, TenantKeys, bearer
from tests.support.rows import insert_task
from tests.support.settings import plain_settings

HEAD_TIMEOUT_S = 1.0
SLACK_S = 4.0
"""The machine is shared by several test runs on 2 cores: a timer may fire late."""
WAIT_S = 30.0


@asynccontextmanager
async def served(settings: Settings, **overrides: Any) -> AsyncIterator[str]:
    """The app under uvicorn configured as `sandhive serve` does; yields host:port."""
    async with live_server(settings, **{**server_options(settings), **overrides}) as server:
        yield server.base_url.removeprefix("http://")


def limits(database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"api_header_timeout_s": HEAD_TIMEOUT_S, "stream_keepalive_s": 0.3}
    return plain_settings(database_url, **{**values, **overrides})


async def open_socket(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = address.split(":")
    return await asyncio.open_connection(host, int(port))


async def seconds_until_closed(
    reader: asyncio.StreamReader, started: float, within_s: float
) -> float:
    """Read (and drop) until the server closes the connection; seconds since `started`."""
    async with asyncio.timeout(within_s):
        while await reader.read(65536):
            pass
    return time.monotonic() - started


async def trickle(writer: asyncio.StreamWriter, data: bytes, every_s: float = 0.2) -> None:
    """Send `data` a byte at a time (slowloris) until it is sent or the server hangs up."""
    for i in range(len(data)):
        writer.write(data[i : i + 1])
        try:
            await writer.drain()
        except OSError:
            return
        await asyncio.sleep(every_s)


SLOW_HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Padding: " + b"a" * 200 + b"\r\n\r\n"
"""A valid request head that takes 50 s to trickle at 5 bytes per second."""


# The request-head deadline


@pytest.mark.parametrize("head", [b"", SLOW_HEAD], ids=["silent", "trickled-header"])
async def test_a_late_request_head_is_cut_at_the_deadline(
    clean_db: str, redis: Redis, head: bytes
) -> None:
    """A silent socket, and a header trickled so it would end after the deadline."""
    async with served(limits(clean_db)) as address:
        started = time.monotonic()
        reader, writer = await open_socket(address)
        sending = asyncio.create_task(trickle(writer, head))
        elapsed = await seconds_until_closed(reader, started, HEAD_TIMEOUT_S + SLACK_S)
        sending.cancel()
        writer.close()
    assert elapsed >= HEAD_TIMEOUT_S * 0.9  # the deadline closed it, not something sooner


async def test_plain_uvicorn_would_keep_that_socket_forever(clean_db: str, redis: Redis) -> None:
    """Negative control: the same server with uvicorn's own HTTP protocol lets it sit."""
    async with served(limits(clean_db), http="httptools") as address:
        reader, writer = await open_socket(address)
        with pytest.raises(TimeoutError):
            await seconds_until_closed(reader, time.monotonic(), HEAD_TIMEOUT_S * 3)
        writer.close()


async def test_the_next_head_on_a_kept_alive_connection_has_a_deadline_too(
    clean_db: str, redis: Redis
) -> None:
    """uvicorn's keep-alive timer stops at the first byte: a trickled second head is cut anyway."""
    async with served(limits(clean_db)) as address:
        reader, writer = await open_socket(address)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(WAIT_S):
            status = await reader.readline()
        assert status.startswith(b"HTTP/1.1 200"), status
        started = time.monotonic()
        sending = asyncio.create_task(trickle(writer, SLOW_HEAD))
        elapsed = await seconds_until_closed(reader, started, HEAD_TIMEOUT_S + SLACK_S)
        sending.cancel()
        writer.close()
    assert elapsed < HEAD_TIMEOUT_S + SLACK_S


async def test_a_slow_body_and_a_prompt_head_are_not_cut_by_the_head_deadline(
    clean_db: str, redis: Redis
) -> None:
    """The deadline covers the head only; the body has its own (request_body_timeout_s)."""
    body = b'{"prompt": "slow but steady"}'
    async with served(limits(clean_db)) as address:
        reader, writer = await open_socket(address)
        writer.write(
            b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        started = time.monotonic()
        for i in range(0, len(body), 4):  # ~2.5 s, well past the head deadline
            writer.write(body[i : i + 4])
            await writer.drain()
            await asyncio.sleep(0.3)
        assert time.monotonic() - started > 2 * HEAD_TIMEOUT_S
        async with asyncio.timeout(WAIT_S):
            status = await reader.readline()
        writer.close()
    assert status.startswith(b"HTTP/1.1 202"), status


async def test_long_lived_websocket_and_sse_streams_outlive_the_head_deadline(
    clean_db: str, redis: Redis, sessions: Sessions
) -> None:
    task_id = await insert_task(sessions, status="running")
    async with served(limits(clean_db)) as address:
        url = f"ws://{address}/v1/tasks/{task_id}/stream"
        async with websockets.connect(url) as ws, httpx.AsyncClient() as client:
            sse_url = f"http://{address}/v1/tasks/{task_id}/events"
            async with client.stream("GET", sse_url, timeout=WAIT_S) as sse:
                assert sse.status_code == 200
                lines = sse.aiter_lines()
                started = time.monotonic()
                keepalives = 0
                while time.monotonic() - started < 3 * HEAD_TIMEOUT_S:
                    async with asyncio.timeout(WAIT_S):
                        assert '"keepalive"' in str(await ws.recv())
                        while (await anext(lines)) != ": keepalive":
                            pass
                    keepalives += 1
            assert keepalives >= 3
            assert ws.close_code is None


# The connection cap


async def test_a_flood_of_silent_sockets_gets_503_until_the_deadline_frees_them(
    clean_db: str, redis: Redis
) -> None:
    settings = limits(clean_db, api_max_connections=5, api_header_timeout_s=3.0)
    async with served(settings) as address, httpx.AsyncClient() as client:
        flood = [await open_socket(address) for _ in range(5)]
        await asyncio.sleep(0.2)
        refused = await client.get(f"http://{address}/healthz", timeout=WAIT_S)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "over_capacity"
        assert refused.headers["retry-after"] == "1"
        async with asyncio.timeout(3.0 + SLACK_S):  # each silent socket closed by its deadline
            for reader, _ in flood:
                while await reader.read(65536):
                    pass
        await asyncio.sleep(0.2)
        ok = await client.get(f"http://{address}/healthz", timeout=WAIT_S)
        assert ok.status_code == 200
        for _, writer in flood:
            writer.close()


async def test_websocket_handshakes_count_against_the_connection_cap_too(
    clean_db: str, redis: Redis, sessions: Sessions
) -> None:
    """uvicorn applies limit_concurrency to plain requests only; serve's protocol to upgrades."""
    task_id = await insert_task(sessions, status="running")
    settings = limits(clean_db, api_max_connections=3)
    async with served(settings) as address, AsyncExitStack() as stack:
        url = f"ws://{address}/v1/tasks/{task_id}/stream"
        first = await keep_open(stack, url)
        await keep_open(stack, url)
        with pytest.raises(InvalidStatus) as refused:
            async with asyncio.timeout(WAIT_S), websockets.connect(url):
                pass
        assert refused.value.response.status_code == 503
        assert json.loads(refused.value.response.body)["error"]["code"] == "over_capacity"
        await first.close()
        for _ in range(100):  # once the server has seen that close
            try:
                assert await connects_within(url, WAIT_S)
                break
            except InvalidStatus:
                await asyncio.sleep(0.1)
        else:
            pytest.fail("a freed connection slot was never reused")


# The per-tenant stream cap


CAP = 3


def stream_url(address: str, task_id: str, key: str) -> str:
    return f"ws://{address}/v1/tasks/{task_id}/stream?token={key}"


async def refused_code(url: str) -> tuple[int | None, str | None]:
    """Close code and reason of a WebSocket the server ends before sending anything."""
    async with asyncio.timeout(WAIT_S), websockets.connect(url) as ws:
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
        return ws.close_code, ws.close_reason


async def keep_open(stack: AsyncExitStack, url: str) -> ClientConnection:
    """A stream that is open and served (its first keepalive arrived)."""
    ws = await stack.enter_async_context(websockets.connect(url))
    async with asyncio.timeout(WAIT_S):
        assert '"keepalive"' in str(await ws.recv())
    return ws


async def connects_within(url: str, seconds: float) -> bool:
    """Whether a new stream gets served (not 4429) within `seconds`, trying again meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        async with asyncio.timeout(WAIT_S), websockets.connect(url) as ws:
            try:
                message = str(await ws.recv())
            except websockets.ConnectionClosed:
                assert ws.close_code == 4429, ws.close_code
                await asyncio.sleep(0.1)
                continue
            assert '"keepalive"' in message
            return True
    return False


def capped(keyed_settings: Settings, **overrides: Any) -> Settings:
    return keyed_settings.model_copy(
        update={
            "stream_max_per_tenant": CAP,
            "stream_keepalive_s": 0.3,
            "api_header_timeout_s": HEAD_TIMEOUT_S,
            **overrides,
        }
    )


async def test_past_the_tenants_cap_streams_are_refused_and_others_are_not(
    keyed_settings: Settings, tenant_keys: TenantKeys, sessions: Sessions
) -> None:
    a_task = await insert_task(sessions, tenant="tenant-a", status="running")
    b_task = await insert_task(sessions, tenant="tenant-b", status="running")
    async with served(capped(keyed_settings)) as address, AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=f"http://{address}"))
        # two WebSockets and one SSE stream: both kinds count
        held = [await keep_open(stack, stream_url(address, a_task, tenant_keys.a)) for _ in "ab"]
        sse = await stack.enter_async_context(
            client.stream(
                "GET", f"/v1/tasks/{a_task}/events", headers=bearer(tenant_keys.a), timeout=WAIT_S
            )
        )
        assert sse.status_code == 200
        # the `retry:` line: the stream is being served (keep the iterator: dropping it
        # mid-body would make httpx close the connection)
        sse_lines = sse.aiter_lines()
        await anext(sse_lines)

        code, reason = await refused_code(stream_url(address, a_task, tenant_keys.a))
        assert code == 4429
        assert reason is not None
        assert "too many open streams" in reason
        refused = await client.get(f"/v1/tasks/{a_task}/events", headers=bearer(tenant_keys.a))
        error = assert_error(refused, 429, "too_many_requests")
        assert "too many open streams" in error["message"]
        assert int(refused.headers["retry-after"]) >= 1

        # another tenant is not affected
        await keep_open(stack, stream_url(address, b_task, tenant_keys.b))
        # the admin key acting as tenant-a counts as tenant-a
        admin = await client.get(
            f"/v1/tasks/{a_task}/events",
            headers={**bearer(ADMIN_KEY), "X-Sandhive-Tenant": "tenant-a"},
        )
        assert_error(admin, 429, "too_many_requests")

        # closing one frees its slot
        await held[0].close()
        assert await connects_within(stream_url(address, a_task, tenant_keys.a), 10)


async def test_an_sse_stream_that_ends_gives_its_slot_back(
    keyed_settings: Settings, tenant_keys: TenantKeys, sessions: Sessions, redis: Redis
) -> None:
    a_task = await insert_task(sessions, tenant="tenant-a", status="running")
    async with served(capped(keyed_settings, stream_max_per_tenant=1)) as address:
        url = f"http://{address}/v1/tasks/{a_task}/events"
        for _ in range(3):  # with a cap of 1, each stream can only open if the last one left
            async with httpx.AsyncClient() as client:
                async with client.stream(
                    "GET", url, headers=bearer(tenant_keys.a), timeout=WAIT_S
                ) as sse:
                    assert sse.status_code == 200, await sse.aread()
                    lines = sse.aiter_lines()
                    await anext(lines)
                    assert await streamslots.open_count(redis, "tenant-a") == 1
            for _ in range(200):  # given back as the response ends
                if await streamslots.open_count(redis, "tenant-a") == 0:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the slot of a finished SSE stream was not given back")


async def test_the_cap_holds_across_api_processes_sharing_redis(
    keyed_settings: Settings, tenant_keys: TenantKeys, sessions: Sessions
) -> None:
    a_task = await insert_task(sessions, tenant="tenant-a", status="running")
    # Refreshed every 1 s, a slot lives 3 s: a refresh may come 2 s late on a loaded machine.
    settings = capped(keyed_settings, stream_keepalive_s=1.0)
    lifetime_s = refresh_every_s(settings) * SLOT_TTL_FACTOR
    async with served(settings) as one, served(settings) as two, AsyncExitStack() as stack:
        await keep_open(stack, stream_url(one, a_task, tenant_keys.a))
        await keep_open(stack, stream_url(one, a_task, tenant_keys.a))
        await keep_open(stack, stream_url(two, a_task, tenant_keys.a))
        for address in (one, two):
            code, _ = await refused_code(stream_url(address, a_task, tenant_keys.a))
            assert code == 4429
        # held slots are refreshed: still full after two slot lifetimes
        await asyncio.sleep(2 * lifetime_s + 0.5)
        code, _ = await refused_code(stream_url(two, a_task, tenant_keys.a))
        assert code == 4429


DEAD_TTL_S = 3.0
"""Long enough for the first refusal on a loaded machine, short enough to wait out."""


async def test_slots_of_a_process_that_died_expire(
    keyed_settings: Settings, tenant_keys: TenantKeys, sessions: Sessions, redis: Redis
) -> None:
    """A crashed API never gives its slots back; they stop counting once they expire."""
    a_task = await insert_task(sessions, tenant="tenant-a", status="running")
    async with served(capped(keyed_settings)) as address:
        # What a dead replica left behind: taken, never refreshed. Taken once this server is
        # up, so that a slow start on a loaded machine does not outlast them.
        for n in range(CAP):
            assert await streamslots.take(redis, "tenant-a", f"dead-{n}", CAP, ttl_s=DEAD_TTL_S)
        url = stream_url(address, a_task, tenant_keys.a)
        code, _ = await refused_code(url)
        assert code == 4429
        assert await connects_within(url, DEAD_TTL_S + SLACK_S)
    assert await streamslots.open_count(redis, "tenant-a") <= 1


# The WebSocket message cap


async def close_code(ws: ClientConnection) -> int | None:
    """Read until the server closes the WebSocket: its close code."""
    try:
        while True:
            await ws.recv()
    except websockets.ConnectionClosed:
        return ws.close_code


async def test_a_websocket_message_over_the_cap_closes_with_1009(
    clean_db: str, redis: Redis, sessions: Sessions
) -> None:
    task_id = await insert_task(sessions, status="running")
    async with served(limits(clean_db)) as address:
        url = f"ws://{address}/v1/tasks/{task_id}/stream"
        async with asyncio.timeout(WAIT_S), websockets.connect(url) as ws:
            await ws.send("x" * 1000)  # small messages are read and ignored
            assert '"keepalive"' in str(await ws.recv())
            await ws.send("x" * (WS_MAX_SIZE + 1))
            assert await close_code(ws) == 1009


# The real `sandhive serve`


def _raw_silence_closed_within(address: str, seconds: float) -> float:
    """Blocking: connect, send nothing, return when the server closes (seconds taken)."""
    host, port = address.split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=seconds) as sock:
        while sock.recv(65536):
            pass
    return time.monotonic() - started


async def test_sandhive_serve_runs_with_these_limits(
    clean_db: str, redis: Redis, tmp_path: Path
) -> None:
    settings = limits(clean_db, api_max_connections=50)
    with running_api(settings, tmp_path / "api.log") as base_url:
        address = base_url.removeprefix("http://")
        elapsed = await asyncio.to_thread(
            _raw_silence_closed_within, address, HEAD_TIMEOUT_S + SLACK_S
        )
        assert elapsed >= HEAD_TIMEOUT_S * 0.9
        async with httpx.AsyncClient(base_url=base_url) as client:
            created = await client.post("/v1/tasks", json={"prompt": "stay queued"})
            assert created.status_code == 202, created.text
            task_id = created.json()["id"]
        url = f"ws://{address}/v1/tasks/{task_id}/stream"
        async with asyncio.timeout(WAIT_S), websockets.connect(url) as ws:
            await asyncio.sleep(3 * HEAD_TIMEOUT_S)  # the open stream is not cut
            await ws.send("x" * (WS_MAX_SIZE + 1))
            assert await close_code(ws) == 1009
