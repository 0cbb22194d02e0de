"""The event stream over real WebSockets and SSE, served by a real uvicorn in the test's loop.

Events are written the way the worker writes them (commit to Postgres, then
publish to Redis) while clients watch: many viewers, a deliberately slow one,
resumption at every point, and the two transports compared.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from app.config import Settings
from app.db.engine import Sessions
from app.db.models import Task
from app.schemas.tasks import EventOut
from app.services import events
from app.services.events import record_event
from tests.api.live_server import LiveServer, live_server
from tests.support.rows import insert_task
from tests.support.settings import plain_settings

WAIT_S = 30.0


def stream_settings(database_url: str, **overrides: Any) -> Settings:
    """No request-rate limit (100 viewers connect at once); the default stream cap, which
    must leave room for 100+ viewers of one tenant (tests/security lowers it)."""
    values = {"rate_limit_per_s": 0, **overrides}
    return plain_settings(database_url, **values)


@pytest.fixture
async def server(clean_db: str, redis: Redis) -> AsyncIterator[LiveServer]:
    async with live_server(stream_settings(clean_db)) as live:
        yield live


async def emit(
    sessions: Sessions, redis: Redis, task_id: str, type_: str = "step.started", **data: Any
) -> EventOut:
    async with sessions.begin() as session:
        event = await record_event(session, task_id, type_, data or {"note": type_})
    await events.publish(redis, event)
    return event


async def finished_task(sessions: Sessions, redis: Redis, durable: int) -> str:
    """A succeeded task with `durable` events, the last one task.finished."""
    task_id = await insert_task(sessions, status="running")
    for _ in range(durable - 1):
        await emit(sessions, redis, task_id)
    await emit(sessions, redis, task_id, events.TASK_FINISHED, status="succeeded")
    async with sessions.begin() as session:
        (await session.get_one(Task, task_id)).status = "succeeded"
    return task_id


async def read_ws(url: str, **options: Any) -> tuple[list[dict[str, Any]], int | None, str]:
    """Every message until the server closes; the close code and reason."""
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(WAIT_S), websockets.connect(url, **options) as ws:
        try:
            async for message in ws:
                got.append(json.loads(message))
        except websockets.ConnectionClosed:
            pass
    assert ws.close_code is not None
    return got, ws.close_code, ws.close_reason or ""


async def read_sse(base_url: str, path: str, headers: dict[str, str] | None = None) -> list[dict]:
    async with (
        asyncio.timeout(WAIT_S),
        httpx.AsyncClient(base_url=base_url) as client,
        client.stream("GET", path, headers=headers) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return [
            json.loads(line[len("data: ") :])
            async for line in response.aiter_lines()
            if line.startswith("data: ")
        ]


async def viewers_attached(server: LiveServer, count: int) -> None:
    """Wait until `count` viewers follow live (their replays are done)."""
    for _ in range(int(WAIT_S / 0.02)):
        if server.hub.stats()["viewers"] >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"only {server.hub.stats()} after {WAIT_S} s")


async def viewers_released(server: LiveServer) -> None:
    """Wait until the API holds no viewer (and so no Redis reader) any more."""
    for _ in range(int(WAIT_S / 0.02)):
        if server.hub.stats() == {"readers": 0, "viewers": 0}:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"still {server.hub.stats()} after {WAIT_S} s")


async def drop_figures(base_url: str) -> tuple[float, float]:
    """From the API's /metrics: (live events dropped for slow clients, slow clients cut off)."""
    async with httpx.AsyncClient(base_url=base_url) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    found = {
        (sample.name, tuple(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    dropped = found[("sandhive_live_events_dropped_total", (("reason", "slow_client"),))]
    return dropped, found[("sandhive_stream_clients_dropped_total", ())]


def durable(messages: list[dict[str, Any]]) -> list[int]:
    return [m["seq"] for m in messages if m["seq"] is not None]


async def test_a_hundred_viewers_see_every_event_through_one_redis_reader(
    server: LiveServer, sessions: Sessions, redis: Redis
) -> None:
    task_id = await insert_task(sessions, status="running")
    url = f"{server.ws_url}/v1/tasks/{task_id}/stream?after=0"
    viewers = [asyncio.create_task(read_ws(url)) for _ in range(100)]
    await viewers_attached(server, 100)
    assert server.hub.stats() == {"readers": 1, "viewers": 100}
    for n in range(20):
        await emit(sessions, redis, task_id)
        await events.publish(redis, events.live_event(task_id, "tool.output", {"chunk": f"{n}"}))
    await emit(sessions, redis, task_id, events.TASK_FINISHED, status="succeeded")

    results = await asyncio.gather(*viewers)
    for messages, code, _ in results:
        assert code == 1000
        assert durable(messages) == list(range(1, 22))
        assert [m["data"]["chunk"] for m in messages if m["type"] == "tool.output"] == [
            str(n) for n in range(20)
        ]
    assert server.hub.stats() == {"readers": 0, "viewers": 0}


def tiny_socket(port: int) -> socket.socket:
    """A connected client socket with a small receive buffer, so the server's sends back up."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


async def test_a_slow_viewer_is_cut_off_with_4408_and_the_others_keep_up(
    clean_db: str, sessions: Sessions, redis: Redis
) -> None:
    settings = stream_settings(clean_db, stream_client_buffer=FAST_BUFFER)
    async with live_server(settings) as live:
        task_id = await insert_task(sessions, status="running")
        await emit(sessions, redis, task_id)
        assert await drop_figures(live.base_url) == (0, 0)
        url = f"{live.ws_url}/v1/tasks/{task_id}/stream?after=0"
        port = int(live.base_url.rsplit(":", 1)[1])
        # No compression: the ~13 MB below must really be bytes on the wire.
        slow = await websockets.connect(url, sock=tiny_socket(port), max_queue=1, compression=None)
        fast = [asyncio.create_task(read_ws(url, max_size=None)) for _ in range(FAST_VIEWERS)]
        await viewers_attached(live, 1 + FAST_VIEWERS)
        await flood(sessions, redis, task_id)

        for fast_messages, fast_code, _ in await asyncio.gather(*fast):  # while slow reads nothing
            assert fast_code == 1000
            assert durable(fast_messages) == [1, 2, 3]
            assert sum(1 for m in fast_messages if m["type"] == "tool.output") == FLOOD_CHUNKS
        await viewers_released(live)  # the stalled viewer was let go without reading a byte

        slow_seen: list[dict[str, Any]] = []
        async with asyncio.timeout(WAIT_S):
            try:
                async for message in slow:
                    slow_seen.append(json.loads(message))
            except websockets.ConnectionClosed:
                pass
        assert slow.close_code == 4408
        last = max(durable(slow_seen), default=0)
        assert slow.close_reason == f"too slow: reconnect with after={last}"
        dropped, cut_off = await drop_figures(live.base_url)
        assert cut_off == 1
        assert dropped >= 10  # at least half the full buffer (idle ticks may hold places)

        resumed, code, _ = await read_ws(f"{live.ws_url}/v1/tasks/{task_id}/stream?after={last}")
        assert code == 1000
        assert durable(slow_seen) + durable(resumed) == [1, 2, 3]


FAST_VIEWERS = 3
FAST_BUFFER = 20
FLOOD_CHUNKS = 400


async def flood(sessions: Sessions, redis: Redis, task_id: str) -> None:
    """~13 MB of live output, far more than socket buffers hold, then seq 2 and task.finished."""
    chunk = "x" * 32_768
    for _ in range(FLOOD_CHUNKS):
        await events.publish(redis, events.live_event(task_id, "tool.output", {"chunk": chunk}))
    await emit(sessions, redis, task_id)
    await emit(sessions, redis, task_id, events.TASK_FINISHED, status="succeeded")


async def stalled_sse(port: int, path: str) -> socket.socket:
    """An SSE request on a tiny-buffered socket whose answer nobody reads (yet)."""
    sock = tiny_socket(port)
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
    await asyncio.get_running_loop().sock_sendall(sock, request.encode())
    return sock


def dechunk(raw: bytes) -> tuple[bytes, bytes, bool]:
    """(head, body, whether the final chunk came) of a chunked HTTP/1.1 response so far."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    body = bytearray()
    while True:
        size_line, found, after = rest.partition(b"\r\n")
        if not found:
            return head, bytes(body), False
        size = int(size_line, 16)
        if size == 0:
            return head, bytes(body), True
        if len(after) < size + 2:
            return head, bytes(body), False
        body += after[:size]
        rest = after[size + 2 :]


async def read_stalled_sse(sock: socket.socket) -> tuple[list[dict[str, Any]], bool]:
    """Read the stalled client's socket at last: its SSE messages, and whether the
    response ended properly (False: the server closed the connection mid-response)."""
    loop = asyncio.get_running_loop()
    raw = bytearray()
    async with asyncio.timeout(WAIT_S):
        while True:
            data = await loop.sock_recv(sock, 1 << 16)
            raw += data
            head, body, complete = dechunk(bytes(raw))
            if complete or not data:
                break
    sock.close()
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"transfer-encoding: chunked" in head.lower()
    frames = body.decode().split("\n\n")[:-1]  # the text after the last blank line is partial
    messages = [
        json.loads(line[len("data: ") :])
        for frame in frames
        for line in frame.split("\n")
        if line.startswith("data: ")
    ]
    return messages, complete


async def test_a_stalled_sse_viewer_is_let_go_and_resumes_with_last_event_id(
    clean_db: str, sessions: Sessions, redis: Redis
) -> None:
    settings = stream_settings(clean_db, stream_client_buffer=FAST_BUFFER)
    async with live_server(settings) as live:
        task_id = await insert_task(sessions, status="running")
        await emit(sessions, redis, task_id)
        path = f"/v1/tasks/{task_id}/events"
        port = int(live.base_url.rsplit(":", 1)[1])
        slow = await stalled_sse(port, path)
        fast = [asyncio.create_task(read_sse(live.base_url, path)) for _ in range(FAST_VIEWERS)]
        await viewers_attached(live, 1 + FAST_VIEWERS)
        await flood(sessions, redis, task_id)

        for fast_messages in await asyncio.gather(*fast):  # while the stalled one reads nothing
            assert durable(fast_messages) == [1, 2, 3]
            assert sum(1 for m in fast_messages if m["type"] == "tool.output") == FLOOD_CHUNKS
        # Cut off while its send was blocked: its place in the hub is freed without
        # the client reading a byte (before, it was held until the client read again).
        await viewers_released(live)
        dropped, cut_off = await drop_figures(live.base_url)
        assert cut_off == 1
        assert dropped >= 10

        slow_seen, _ = await read_stalled_sse(slow)  # it ends: cleanly, or closed if too late
        assert events.TASK_FINISHED not in [m["type"] for m in slow_seen]
        assert sum(1 for m in slow_seen if m["type"] == "tool.output") < FLOOD_CHUNKS
        last = max(durable(slow_seen), default=0)
        resumed = await read_sse(live.base_url, path, {"Last-Event-ID": str(last)})
        assert durable(slow_seen) + durable(resumed) == [1, 2, 3]
        assert resumed[-1]["type"] == events.TASK_FINISHED


async def test_resuming_at_every_point_over_websocket_and_sse_agree(
    server: LiveServer, sessions: Sessions, redis: Redis
) -> None:
    task_id = await finished_task(sessions, redis, durable=6)
    ws_all, code, _ = await read_ws(f"{server.ws_url}/v1/tasks/{task_id}/stream")
    assert code == 1000
    assert durable(ws_all) == [1, 2, 3, 4, 5, 6]
    assert ws_all[-1]["type"] == events.TASK_FINISHED
    for after in range(6):
        path = f"/v1/tasks/{task_id}"
        over_ws, code, _ = await read_ws(f"{server.ws_url}{path}/stream?after={after}")
        over_sse = await read_sse(server.base_url, f"{path}/events?after={after}")
        by_header = await read_sse(
            server.base_url, f"{path}/events?after=0", {"Last-Event-ID": str(after)}
        )
        assert code == 1000
        assert over_ws == over_sse == by_header == ws_all[after:]


async def test_nothing_left_of_a_finished_task(
    server: LiveServer, sessions: Sessions, redis: Redis
) -> None:
    task_id = await finished_task(sessions, redis, durable=3)
    messages, code, _ = await read_ws(f"{server.ws_url}/v1/tasks/{task_id}/stream?after=3")
    assert (messages, code) == ([], 1000)
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        response = await client.get(f"/v1/tasks/{task_id}/events", headers={"Last-Event-ID": "3"})
    assert response.status_code == 204  # tells an EventSource to stop reconnecting


async def test_live_steps_reach_a_viewer_connected_mid_task(
    server: LiveServer, sessions: Sessions, redis: Redis
) -> None:
    task_id = await insert_task(sessions, status="running")
    for _ in range(3):
        await emit(sessions, redis, task_id)
    viewer = asyncio.create_task(read_ws(f"{server.ws_url}/v1/tasks/{task_id}/stream?after=2"))
    await viewers_attached(server, 1)
    await emit(sessions, redis, task_id)
    await events.publish(redis, events.live_event(task_id, "llm.delta", {"text": "hi"}))
    await emit(sessions, redis, task_id, events.TASK_FINISHED, status="failed")
    messages, code, _ = await viewer
    assert code == 1000
    assert [(m["seq"], m["type"]) for m in messages] == [
        (3, "step.started"),
        (4, "step.started"),
        (None, "llm.delta"),
        (5, events.TASK_FINISHED),
    ]


def without_keepalives(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """WebSocket idle ticks are messages; SSE's are comments: compare the rest."""
    return [m for m in messages if m["type"] != events.KEEPALIVE]


async def test_sse_and_websocket_follow_a_running_task_alike(
    server: LiveServer, sessions: Sessions, redis: Redis
) -> None:
    task_id = await insert_task(sessions, status="running")
    await emit(sessions, redis, task_id, "task.started", attempt=1)  # replayed, then live
    path = f"/v1/tasks/{task_id}"
    over_ws = asyncio.create_task(read_ws(f"{server.ws_url}{path}/stream?after=0"))
    over_sse = asyncio.create_task(read_sse(server.base_url, f"{path}/events?after=0"))
    await viewers_attached(server, 2)
    for n in range(3):
        await emit(sessions, redis, task_id, "step.started", index=n)
        for text in ("I will ", "count."):
            delta = {"index": n, "text": text}
            await events.publish(redis, events.live_event(task_id, "llm.delta", delta))
        output = {"index": n, "stream": "stdout", "chunk": f"tick {n}\n"}
        await events.publish(redis, events.live_event(task_id, "tool.output", output))
        await emit(sessions, redis, task_id, "step.completed", index=n)
    await emit(sessions, redis, task_id, events.TASK_FINISHED, status="succeeded")

    ws_messages, code, _ = await over_ws
    sse_messages = await over_sse
    assert code == 1000
    assert without_keepalives(ws_messages) == sse_messages
    step = [
        (None, "llm.delta", "I will "),
        (None, "llm.delta", "count."),
        (None, "tool.output", "tick {n}\n"),
    ]
    expected: list[tuple[int | None, str, str | None]] = [(1, "task.started", None)]
    for n in range(3):
        expected.append((2 + 2 * n, "step.started", None))
        expected += [(seq, kind, text.format(n=n)) for seq, kind, text in step]
        expected.append((3 + 2 * n, "step.completed", None))
    expected.append((8, events.TASK_FINISHED, None))
    live_text = {"llm.delta": "text", "tool.output": "chunk"}
    assert [
        (m["seq"], m["type"], m["data"][live_text[m["type"]]] if m["seq"] is None else None)
        for m in sse_messages
    ] == expected


async def test_resuming_at_every_point_of_a_running_task(
    server: LiveServer, sessions: Sessions, redis: Redis
) -> None:
    """After each durable event k, readers join with every after in 0..k; all get the rest once."""
    steps = 4
    end = steps + 1  # then task.finished
    task_id = await insert_task(sessions, status="running")
    path = f"/v1/tasks/{task_id}"
    readers: list[tuple[str, int, asyncio.Task[Any]]] = []
    for k in range(1, steps + 1):
        await emit(sessions, redis, task_id, "step.completed", index=k)
        await events.publish(redis, events.live_event(task_id, "tool.output", {"chunk": f"{k}"}))
        for after in range(k + 1):
            ws_url = f"{server.ws_url}{path}/stream?after={after}"
            header = {"Last-Event-ID": str(after)}  # wins over ?after=0
            sse = read_sse(server.base_url, f"{path}/events?after=0", header)
            readers.append(("ws", after, asyncio.create_task(read_ws(ws_url))))
            readers.append(("sse", after, asyncio.create_task(sse)))
        await viewers_attached(server, len(readers))  # all joined at point k
    await emit(sessions, redis, task_id, events.TASK_FINISHED, status="succeeded")

    for transport, after, reader in readers:
        result = await reader
        if transport == "ws":
            messages, code, _ = result
            assert code == 1000, (after, code)
        else:
            messages = result
        assert durable(messages) == list(range(after + 1, end + 1)), (transport, after)
        assert messages[-1]["type"] == events.TASK_FINISHED
    assert server.hub.stats() == {"readers": 0, "viewers": 0}


async def test_unknown_and_foreign_tasks_close_with_4404(
    server: LiveServer, sessions: Sessions
) -> None:
    foreign = await insert_task(sessions, tenant="someone-else", status="running")
    for task_id in ("tsk_nope", foreign):
        messages, code, _ = await read_ws(f"{server.ws_url}/v1/tasks/{task_id}/stream")
        assert (messages, code) == ([], 4404)
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            response = await client.get(f"/v1/tasks/{task_id}/events")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
    assert server.hub.stats() == {"readers": 0, "viewers": 0}


async def test_idle_streams_get_keepalives(clean_db: str, sessions: Sessions) -> None:
    async with live_server(stream_settings(clean_db, stream_keepalive_s=0.2)) as live:
        task_id = await insert_task(sessions, status="running")
        async with websockets.connect(f"{live.ws_url}/v1/tasks/{task_id}/stream") as ws:
            async with asyncio.timeout(WAIT_S):
                message = json.loads(await ws.recv())
        assert (message["type"], message["seq"], message["task_id"]) == ("keepalive", None, task_id)
        await viewers_released(live)  # the client left: its place in the hub went with it
        async with (
            asyncio.timeout(WAIT_S),
            httpx.AsyncClient(base_url=live.base_url) as client,
            client.stream("GET", f"/v1/tasks/{task_id}/events") as response,
        ):
            lines = response.aiter_lines()
            assert await anext(lines) == "retry: 2000"
            while (line := await anext(lines)) == "":
                pass
            assert line == ": keepalive"
        await viewers_released(live)  # the SSE client left mid-stream of a running task


async def test_stream_auth_errors_are_close_codes_and_the_token_is_read(
    clean_db: str, sessions: Sessions
) -> None:
    settings = stream_settings(clean_db, auth="keys")
    async with live_server(settings) as live:
        task_id = await insert_task(sessions, status="running")
        url = f"{live.ws_url}/v1/tasks/{task_id}/stream"
        missing, code_missing, reason_missing = await read_ws(url)
        wrong, code_wrong, reason_wrong = await read_ws(f"{url}?token=not-a-key")
    assert (missing, code_missing) == ([], 4401)
    assert (wrong, code_wrong) == ([], 4401)
    assert reason_missing != reason_wrong  # the ?token= reached the key check


async def test_model_text_with_line_separators_stays_one_sse_line(
    server: LiveServer, sessions: Sessions, redis: Redis
) -> None:
    """U+2028 and friends in a step's text (raw in JSON) would end the `data:` line for a
    reader that splits like `str.splitlines` (httpx's `aiter_lines`, the Python client)."""
    thought = "I give up\u2028here\u2029and\x85there"
    task_id = await insert_task(sessions, status="running")
    await emit(sessions, redis, task_id, "step.finished", thought=thought)
    await emit(sessions, redis, task_id, events.TASK_FINISHED, status="succeeded")
    async with sessions.begin() as session:
        (await session.get_one(Task, task_id)).status = "succeeded"
    got = await read_sse(server.base_url, f"/v1/tasks/{task_id}/events")
    assert [m["data"].get("thought") for m in got if m["type"] == "step.finished"] == [thought]
