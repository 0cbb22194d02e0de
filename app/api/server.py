"""How `sandhive serve` runs uvicorn: connection limits and a deadline on every request head.

uvicorn (0.54) starts no timer when a connection opens, and its keep-alive timer
is cancelled by the first byte that arrives. A client that connects and sends
nothing, or trickles a header a byte at a time (slowloris), so holds a socket
and a file descriptor forever. `HeadDeadlineProtocol` is uvicorn's httptools
protocol (the one its `http="auto"` picks, since `uvicorn[standard]` installs
httptools) plus one timer: armed when the connection opens and again when a
response ends on a kept-alive connection, disarmed when a request's head (request
line and headers) is complete, it closes the socket if the head is late. A body,
a long SSE response or a WebSocket (its handshake is a complete head) is never
cut by it: bodies have their own deadline (`SANDHIVE_REQUEST_BODY_TIMEOUT_S`,
app/api/middleware.py).

`limit_concurrency` bounds open connections: past it the API answers 503 in the
contract's error shape (also to a WebSocket handshake, which uvicorn lets through), and the
head deadline frees the sockets that never send a request. Tests build the same
server from `server_options`, so what they check is what `serve` runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, ClassVar

from uvicorn._types import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, Scope
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from app import defaults
from app.api.streaming import STOPPING
from app.config import Settings

log = logging.getLogger(__name__)

_EXTENDED = ("_start_asgi_task", "on_headers_complete", "on_response_complete", "shutdown")
if not all(callable(getattr(HttpToolsProtocol, name, None)) for name in _EXTENDED):
    raise ImportError(f"uvicorn's HttpToolsProtocol lacks one of {_EXTENDED}: see pyproject")

WS_MAX_SIZE = 64 * 2**10
"""Largest WebSocket message a client may send (1009 above): clients send only control frames."""
OVER_CAPACITY_BODY = json.dumps(
    {
        "error": {
            "code": "over_capacity",
            "message": "the API has too many open connections; retry shortly",
            "details": None,
        }
    }
).encode()
OVER_CAPACITY_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(OVER_CAPACITY_BODY)).encode()),
    (b"retry-after", b"1"),
    (b"connection", b"close"),
]
SERVICE_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    + b"".join(name + b": " + value + b"\r\n" for name, value in OVER_CAPACITY_HEADERS)
    + b"\r\n"
    + OVER_CAPACITY_BODY
)
"""The answer past `limit_concurrency`, in the contract's error shape (uvicorn's is plain text)."""
GRACEFUL_SHUTDOWN_S = 10
"""How long responses in flight may run after SIGTERM (SSE ones end at once: `STOPPING`)."""


class HeadDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools HTTP/1.1 protocol that closes connections whose request head is late."""

    head_timeout_s: ClassVar[float] = defaults.API_HEADER_TIMEOUT_S
    """Set per server by `with_head_deadline`; uvicorn builds protocols from the class alone."""

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def on_headers_complete(self) -> None:
        # Also the point a WebSocket upgrade is decided: the handshake is a whole head.
        self._disarm_head_deadline()
        super().on_headers_complete()

    def handle_websocket_upgrade(self) -> None:
        # uvicorn checks limit_concurrency for plain requests only: an upgrade skips it.
        limit = self.limit_concurrency
        if limit is not None and len(self.connections) >= limit:
            log.warning("refusing a WebSocket: %d open connections", len(self.connections))
            self.transport.write(SERVICE_UNAVAILABLE)
            self.transport.close()
            return
        super().handle_websocket_upgrade()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        # uvicorn picks its plain-text 503 app when over `limit_concurrency`; answer ours.
        super()._start_asgi_task(cycle, _over_capacity if app is service_unavailable else app)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # uvicorn armed its keep-alive timer: the connection now waits for the next
        # head, and the first byte of it would cancel that timer (but not this one).
        if self.timeout_keep_alive_task is not None:
            self._arm_head_deadline()

    def shutdown(self) -> None:
        # SIGTERM: uvicorn closes idle connections and lets responses in flight run
        # to the graceful deadline; SSE responses watch this event and end now.
        stopping = self.app_state.get(STOPPING)
        if isinstance(stopping, asyncio.Event):
            stopping.set()
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def _arm_head_deadline(self) -> None:
        self._disarm_head_deadline()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_overdue)

    def _disarm_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            log.debug(
                "closing %s: no complete request head in %gs", self.client, self.head_timeout_s
            )
            self.transport.close()


async def _over_capacity(
    _scope: Scope, _receive: ASGIReceiveCallable, send: ASGISendCallable
) -> None:
    await send({"type": "http.response.start", "status": 503, "headers": OVER_CAPACITY_HEADERS})
    await send({"type": "http.response.body", "body": OVER_CAPACITY_BODY, "more_body": False})


def with_head_deadline(timeout_s: float) -> type[HeadDeadlineProtocol]:
    """The protocol class with this deadline (a subclass, so servers in one process differ)."""
    return type("HeadDeadlineProtocol", (HeadDeadlineProtocol,), {"head_timeout_s": timeout_s})


def server_options(settings: Settings) -> dict[str, Any]:
    """The uvicorn settings of `sandhive serve` (besides app, host and port)."""
    return {
        "http": with_head_deadline(settings.api_header_timeout_s),
        "limit_concurrency": settings.api_max_connections,
        "ws_max_size": WS_MAX_SIZE,
        "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_S,
        "log_config": None,  # logs.setup's handler, format and redaction
        "access_log": settings.api_access_log,
    }
