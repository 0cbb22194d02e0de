"""The real app under a real uvicorn, in the test's own event loop, for WebSocket and SSE tests.

`httpx.ASGITransport` cannot speak WebSocket, so stream tests talk to a real
server on a loopback port while they write events the way the worker does,
from the same loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn

from app.api.app import create_app
from app.bus.fanout import LiveHub
from app.config import Settings
from tests.support.processes import free_port


@dataclass
class LiveServer:
    base_url: str
    ws_url: str
    server: uvicorn.Server

    @property
    def hub(self) -> LiveHub:
        """The process's live hub, to check how many Redis readers it runs."""
        hub: LiveHub = self.server.lifespan.state["hub"]
        return hub


@asynccontextmanager
async def live_server(settings: Settings, **options: Any) -> AsyncIterator[LiveServer]:
    """Start the app on a free port (lifespan included); stop it on the way out, and fail
    if uvicorn had to cancel a handler at its graceful deadline (one outlived its client).

    `options` are more uvicorn settings, e.g. `server_options(settings)` to run
    what `sandhive serve` runs.
    """
    port = free_port()
    defaults: dict[str, Any] = {
        "log_config": None,
        "log_level": "warning",
        "access_log": False,
    }
    config = uvicorn.Config(
        create_app(settings),
        host="127.0.0.1",
        port=port,
        lifespan="on",
        **{**defaults, **options, "timeout_graceful_shutdown": 5},  # no handler should need it
    )
    server = uvicorn.Server(config)
    cut_short = _CutShort()
    logging.getLogger("uvicorn.error").addHandler(cut_short)
    serving = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(20):
            while not server.started:
                if serving.done():
                    serving.result()
                    raise RuntimeError("uvicorn stopped before it started")
                await asyncio.sleep(0.02)
        yield LiveServer(f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}", server)
    finally:
        server.should_exit = True
        try:
            await serving
        finally:
            logging.getLogger("uvicorn.error").removeHandler(cut_short)
    # Every test's clients have left by now: a handler still running at the graceful
    # deadline outlived its client (it also ran on after the lifespan closed Redis).
    assert not cut_short.messages, cut_short.messages


class _CutShort(logging.Handler):
    """Notes uvicorn cancelling request handlers at its graceful-shutdown deadline."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "timeout graceful shutdown exceeded" in record.getMessage():
            self.messages.append(record.getMessage())
