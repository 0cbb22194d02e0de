"""Fault 4: the API restarts while a WebSocket client follows a task.

Invariant 3 across restarts: the client reconnects with `after=<last seq>` and
ends up with every durable event exactly once, in order, the same as Postgres
holds; the worker and the task are unaffected. The API is killed once with
SIGKILL (the connection just drops) and once with SIGTERM (closed with a
"going away / restart" code that invites a reconnect).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import websockets

from app.api.server import GRACEFUL_SHUTDOWN_S
from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.e2e.fault_harness import (
    Cluster,
    check_consistency,
    cluster,
    db_events,
    fault_settings,
    submit,
    wait_terminal,
)
from tests.support.private_redis import PrivateRedis

STEPS = 30
"""~20 s of task: it outlasts both restarts of the API."""
RECONNECT_CODES = {1001, 1012}
"""Going away / service restart: what a server shutting down sends (RFC 6455 and IANA)."""


def long_script() -> Script:
    turns = [
        Turn(tool="execute_bash", arguments={"command": f"echo {i}"}, delay_s=0.7)
        for i in range(STEPS - 1)
    ]
    return Script(turns=[*turns, Turn(tool="submit", arguments={})])


class Follower:
    """A WebSocket client that keeps every durable event it receives, across reconnects."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.events: list[dict[str, Any]] = []
        self.closes: list[int | None] = []

    @property
    def last(self) -> int:
        return self.events[-1]["seq"] if self.events else 0

    async def follow(self, until_more: int | None = None) -> bool:
        """Read from after=last until the server closes, or until `until_more` new events.

        True when the connection is still open (we stopped reading), False once closed.
        """
        async with websockets.connect(f"{self.url}?after={self.last}", open_timeout=10) as ws:
            got = 0
            try:
                async for message in ws:
                    event = json.loads(message)
                    if event.get("seq") is not None:
                        self.events.append(event)
                        got += 1
                    if until_more is not None and got >= until_more:
                        return True
            except websockets.ConnectionClosed:
                pass
            self.closes.append(ws.close_code)
            return False


class SSEFollower:
    """An EventSource-like client: it reconnects with `Last-Event-ID` until task.finished.

    Runs alongside the WebSocket follower through both restarts; it never learns
    about them except by its stream ending or its connection failing.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.events: list[dict[str, Any]] = []
        self.connections: list[str] = []
        """How each accepted connection ended: "finished", "ended" or "dropped"."""
        self.ended_at: list[float] = []
        """When each accepted connection ended (time.monotonic)."""
        self.finished = False

    async def follow(self, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s), httpx.AsyncClient(timeout=10) as client:
            while not self.finished:
                headers = {"Last-Event-ID": str(self.events[-1]["seq"])} if self.events else {}
                try:
                    async with client.stream(
                        "GET", self.url, headers=headers, timeout=httpx.Timeout(10, read=None)
                    ) as response:
                        if response.status_code == 204:  # finished, nothing after Last-Event-ID
                            self.finished = True
                            break
                        assert response.status_code == 200, response.status_code
                        self.connections.append("dropped")
                        try:
                            await self._read(response)
                            self.connections[-1] = "finished" if self.finished else "ended"
                        finally:
                            self.ended_at.append(time.monotonic())
                except httpx.TransportError:  # dropped mid-stream, or the API is not back yet
                    pass
                if not self.finished:
                    await asyncio.sleep(0.2)  # an EventSource waits `retry:` ms; keep it short

    async def _read(self, response: httpx.Response) -> None:
        fields: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line:
                if not line.startswith(":"):  # not a keepalive comment
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")
                continue
            if "id" in fields:  # a durable event (live ones carry no id)
                event = json.loads(fields["data"])
                assert str(event["seq"]) == fields["id"]
                assert event["type"] == fields["event"]
                self.events.append(event)
                self.finished = event["type"] == "task.finished"
            fields = {}


async def follow_through_restarts(procs: Cluster, task_id: str) -> tuple[Follower, float]:
    """The WebSocket follower's events, and when the API got its SIGTERM (time.monotonic)."""
    follower = Follower(f"{procs.ws_url}/v1/tasks/{task_id}/stream")
    terminated_at = 0.0
    for how in (signal.SIGKILL, signal.SIGTERM):
        reader = asyncio.create_task(follower.follow())
        while len(follower.events) < follower_target(follower):
            await asyncio.sleep(0.05)
            assert not reader.done(), f"the stream ended early: {follower.closes}"
        assert procs.api is not None
        procs.api.send_signal(how)
        terminated_at = time.monotonic()
        await asyncio.wait_for(reader, 30)
        await asyncio.to_thread(procs.api.wait, 30)
        await asyncio.to_thread(procs.start_api)
    await follower.follow()  # to the end: the server closes with 1000 after task.finished
    return follower, terminated_at


def follower_target(follower: Follower) -> int:
    """Read a few more events on each connection before pulling the plug."""
    return (len(follower.closes) + 1) * 4


def test_api_restarts_while_a_client_follows(
    settings: Settings,
    private_redis: PrivateRedis,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    scripted_llm.add_script("fault-api-restart", long_script())
    config = fault_settings(settings, private_redis.url)
    with cluster(config, tmp_path) as procs:
        procs.start_api()
        procs.start_worker("steady")
        with httpx.Client(base_url=procs.base_url, timeout=10) as client:
            task_id = submit(client, "fault-api-restart")
            sse = SSEFollower(f"{procs.base_url}/v1/tasks/{task_id}/events")

        async def both() -> tuple[Follower, float]:
            viewer = asyncio.create_task(sse.follow(timeout_s=120))
            followed = await follow_through_restarts(procs, task_id)
            await viewer
            return followed

        follower, terminated_at = asyncio.run(both())
        with httpx.Client(base_url=procs.base_url, timeout=10) as client:
            task = wait_terminal(client, task_id)

    killed, terminated, finished = follower.closes
    print(f"close codes: SIGKILL {killed}, SIGTERM {terminated}, end {finished}")
    assert killed not in (1000, *RECONNECT_CODES), "SIGKILL: the connection just drops"
    assert terminated in RECONNECT_CODES, f"SIGTERM closes with a reconnect code, got {terminated}"
    assert finished == 1000
    stored = db_events(config.database_url, task_id)
    assert [(e["seq"], e["type"]) for e in follower.events] == [
        (e["seq"], e["type"]) for e in stored
    ], "every durable event exactly once, in order, across two restarts"
    assert [e["data"] for e in follower.events] == [e["data"] for e in stored]
    print(f"SSE connections: {sse.connections}, ended {[t - terminated_at for t in sse.ended_at]}")
    assert [(e["seq"], e["type"]) for e in sse.events] == [(e["seq"], e["type"]) for e in stored], (
        "SSE with Last-Event-ID: every durable event exactly once, in order, across both restarts"
    )
    # SIGKILL drops the SSE response; SIGTERM ends it at once (not at the graceful-shutdown
    # deadline); each time the viewer resumes from its Last-Event-ID on the restarted API.
    assert len(sse.connections) == 3, sse.connections
    assert sse.connections[0] == "dropped"
    assert sse.connections[2] == "finished"
    held = sse.ended_at[1] - terminated_at
    assert held < GRACEFUL_SHUTDOWN_S - 5, f"SIGTERM held the SSE response {held:.1f} s"
    assert sse.connections[1] == "ended", "a clean end of the response, not a dropped connection"
    assert (task["status"], task["attempt"]) == ("succeeded", 1), "the worker was unaffected"
    check_consistency(config, [task_id], private_redis.client())
