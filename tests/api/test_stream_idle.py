"""An idle live stream still delivers at once: no blocking Redis read outlasts its socket.

A live-only event (`llm.delta`, `tool.output`) has no Postgres copy to catch up
from: it reaches a viewer only through the API's blocking read of the task's
live stream, which waits up to `SANDHIVE_STREAM_KEEPALIVE_S` (15 s) for the next
entry. A Redis client whose socket timeout is shorter (redis-py 8 defaults to
5 s) fails every idle read, logs the stream "unreadable" and sleeps a keepalive
before reading again, so an event published meanwhile arrives up to ~20 s late.
Real uvicorn, Redis and Postgres, default settings; the test takes about 30 s.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
import websockets
from pydantic import ValidationError
from redis.asyncio import Redis

from app.config import Settings
from app.db.engine import Sessions
from app.services import events
from tests.api.live_server import LiveServer, live_server
from tests.support.rows import insert_task
from tests.support.settings import plain_settings

IDLE_S = 27.0
"""Silence before the event: well past 20 s, and inside the window where a reader whose
idle reads fail (at 5 s, then 25 s, ...) sleeps a 15 s keepalive before reading again."""
DELIVERED_WITHIN_S = 2.0
ATTACH_WITHIN_S = 10.0


async def attached(server: LiveServer) -> None:
    """Wait until the viewer follows live (its replay of nothing is done)."""
    for _ in range(int(ATTACH_WITHIN_S / 0.02)):
        if server.hub.stats()["viewers"] >= 1:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"no viewer attached after {ATTACH_WITHIN_S} s: {server.hub.stats()}")


async def next_event(ws: Any) -> dict[str, Any]:
    """The next message that is not a keepalive."""
    while True:
        message = json.loads(await ws.recv())
        if message["type"] != events.KEEPALIVE:
            return dict(message)


async def test_a_live_event_after_a_long_silence_arrives_at_once(
    clean_db: str, redis: Redis, sessions: Sessions, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="app.bus.fanout")
    task_id = await insert_task(sessions, status="running")
    async with (
        live_server(plain_settings(clean_db)) as server,
        websockets.connect(f"{server.ws_url}/v1/tasks/{task_id}/stream") as ws,
    ):
        await attached(server)
        await asyncio.sleep(IDLE_S)
        delta = events.live_event(task_id, "llm.delta", {"text": "still here"})
        await events.publish(redis, delta)
        try:
            async with asyncio.timeout(DELIVERED_WITHIN_S):
                got = await next_event(ws)
        except TimeoutError:
            logged = [r.getMessage() for r in caplog.records]
            pytest.fail(
                f"not delivered within {DELIVERED_WITHIN_S} s after {IDLE_S} s idle; "
                f"the hub logged: {logged}"
            )
    assert (got["type"], got["data"], got["seq"]) == ("llm.delta", {"text": "still here"}, None)
    unreadable = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert unreadable == [], "an idle read of the live stream failed"


def test_a_keepalive_the_redis_socket_timeout_would_cut_short_is_refused(clean_db: str) -> None:
    with pytest.raises(ValidationError, match="redis_socket_timeout_s"):
        plain_settings(clean_db, stream_keepalive_s=20, redis_socket_timeout_s=20)
    with pytest.raises(ValidationError, match="redis_socket_timeout_s"):
        plain_settings(clean_db, stream_keepalive_s=30)  # the default socket timeout is less
    settings: Settings = plain_settings(clean_db, stream_keepalive_s=30, redis_socket_timeout_s=40)
    assert settings.stream_keepalive_s < settings.redis_socket_timeout_s
