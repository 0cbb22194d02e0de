"""The plumbing every event-stream route shares, whatever it streams (a task's events in
app/api/tasks/stream.py, an experiment's in app/api/experiments/stream.py), so that the two
end, refuse and give way the same: a WebSocket served under the tenant's open-stream cap
with its errors turned into close codes, an SSE response that ends when the client
leaves or the server stops, and the race that lets a blocked send go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Response, WebSocket, WebSocketDisconnect
from starlette.requests import HTTPConnection
from starlette.types import Receive, Scope, Send

from app.api import streamcap
from app.api.deps import current_tenant
from app.errors import AppError
from app.kit import cancelling, outage
from app.resources import Resources

log = logging.getLogger(__name__)

CLOSE_DONE = 1000
CLOSE_SERVER_ERROR = 1011
CLOSE_TRY_AGAIN = 1013
"""RFC 6455 "try again later": a backend the stream needs is unreachable."""
CLOSE_WAIT_S = 10.0
STOPPING_CLOSE_WAIT_S = 1.0
SEQ_MAX = 2**31 - 1
"""`seq` is a Postgres integer: a larger `after` is a 422, not a database error."""
SSE_RETRY_MS = 2000
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
STOPPING = "stopping"
"""Lifespan-state key of the event `sandhive serve` sets on SIGTERM (app/api/server.py).

WebSockets get uvicorn's 1012 then; an SSE response would run on until the
graceful-shutdown deadline and hold up the exit, so it ends at once instead and
the EventSource resumes with Last-Event-ID on another (or the restarted) API.
"""

Closing = tuple[int, str] | None
"""How to end a WebSocket (code, reason), or None when the client already left."""

Serving = Callable[[str], Awaitable[Closing]]
"""Streams to a WebSocket for a tenant (its key checked, a stream slot held); how to end."""

SsePump = Callable[[Receive, Send, asyncio.Event], Awaitable[None]]
"""Sends SSE frames until done, the client leaving (`request_gone`) or the server stopping
(the event); raises what ends the response early."""


def get_stopping(conn: HTTPConnection) -> asyncio.Event:
    stopping: asyncio.Event = getattr(conn.state, STOPPING)
    return stopping


Stopping = Annotated[asyncio.Event, Depends(get_stopping)]


async def serve_websocket(ws: WebSocket, res: Resources, subject: str, serving: Serving) -> None:
    """Accept, stream, and close with the code that says why it ended (none if the client
    left first); `subject` (the task or experiment id) names the stream in the log."""
    await ws.accept()
    closing = await _serve(ws, res, subject, serving)
    if closing is not None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError, TimeoutError):
            await asyncio.wait_for(ws.close(*closing), CLOSE_WAIT_S)


async def _serve(ws: WebSocket, res: Resources, subject: str, serving: Serving) -> Closing:
    try:
        tenant = await current_tenant(ws, res)  # here, not a dependency: errors become close codes
        async with streamcap.stream_slot(res, tenant):  # 4429 past the tenant's open-stream cap
            return await serving(tenant)
    except AppError as exc:
        return closing_for(exc)
    except Exception as exc:
        if (down := outage.unavailable(exc, res.settings.unavailable_retry_after_s)) is not None:
            log.warning("event stream of %s: %s (%r)", subject, down.code, exc)
            return closing_for(down)
        log.exception("event stream of %s failed", subject)
        return CLOSE_SERVER_ERROR, "server error: reconnect with after=<last seq>"


def closing_for(exc: AppError) -> tuple[int, str]:
    """4000 + the status of a refusal, 1013 for an outage (503), 1011 for the rest."""
    if 400 <= exc.status < 500:
        return 4000 + exc.status, exc.message[:100]
    return (CLOSE_TRY_AGAIN if exc.status == 503 else CLOSE_SERVER_ERROR), exc.message[:100]


def sender_closing(sender: asyncio.Task[None]) -> Closing:
    """How a WebSocket ends once its sender did: 1000 when all was sent, nothing to send
    when the client left meanwhile; any other error is raised for `_serve` to turn into
    a close code."""
    if (error := sender.exception()) is None:
        return CLOSE_DONE, ""
    if isinstance(error, WebSocketDisconnect):
        return None
    raise error


async def race(
    sending: Coroutine[Any, Any, None], *watching: Coroutine[Any, Any, object]
) -> asyncio.Task[None] | None:
    """Send until done, or until a watcher (the client left, the server stops) fires first.

    The send runs as a task so that a stream is let go at once when a watcher fires,
    even while a send is blocked (for a stalled client it never returns). Everything
    is cancelled on the way out. Returns the sender's task if it ended first (its
    result or error to read).
    """
    sender = asyncio.create_task(sending)
    watchers = [asyncio.create_task(w) for w in watching]
    try:
        done, _ = await asyncio.wait([sender, *watchers], return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancelling.stop([sender, *watchers])  # even one that lost its cancel
    return sender if sender in done and not sender.cancelled() else None


async def client_gone(ws: WebSocket) -> None:
    """Read (and ignore) what the client sends until it disconnects; keeps pongs flowing."""
    while (await ws.receive())["type"] != "websocket.disconnect":
        pass


class SseResponse(Response):
    """A stream as Server-Sent Events, raced (by its pump) against the client leaving and
    the server stopping.

    Not a StreamingResponse, which would hold a stalled client (and whatever it
    holds, such as a task viewer's place in the live hub) for as long as its blocked
    send: the pump races its sending against the ways a stream ends. The response
    then ends and an EventSource reconnects with Last-Event-ID; a client that does
    not take even that end within CLOSE_WAIT_S has its connection closed (uvicorn
    logs it). The pump raising one of `ends` ends the response quietly, a backend
    outage with a warning (too late for a 503: the reconnect gets it if still down).
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        pump: SsePump,
        stopping: asyncio.Event,
        *,
        ends: tuple[type[Exception], ...],
        subject: str,
    ) -> None:
        # Not Response.__init__: no body, so no Content-Length (as StreamingResponse does).
        self.status_code = 200
        self.background = None
        self.init_headers(SSE_HEADERS)
        self._pump = pump
        self._stopping = stopping
        self._ends = ends
        self._subject = subject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        with contextlib.suppress(OSError):  # an ASGI 2.4 server's word for a client gone
            await sse_send(send, f"retry: {SSE_RETRY_MS}\n\n")
            await self._run(receive, send)
        end = {"type": "http.response.body", "body": b"", "more_body": False}
        with contextlib.suppress(OSError, TimeoutError):
            # Stopping: a stalled client must not hold the exit for the graceful window.
            wait_s = STOPPING_CLOSE_WAIT_S if self._stopping.is_set() else CLOSE_WAIT_S
            await asyncio.wait_for(send(end), wait_s)

    async def _run(self, receive: Receive, send: Send) -> None:
        try:
            await self._pump(receive, send, self._stopping)
        except self._ends:
            return  # the response ends; an EventSource reconnects with Last-Event-ID
        except Exception as exc:
            if (backend := outage.backend_down(exc)) is None:
                raise
            log.warning("%s ended: %s is unreachable (%r)", self._subject, backend, exc)


async def sse_send(send: Send, text: str) -> None:
    await send({"type": "http.response.body", "body": text.encode(), "more_body": True})


async def request_gone(receive: Receive) -> None:
    """Wait for the HTTP client to disconnect (ASGI `http.disconnect`)."""
    while (await receive())["type"] != "http.disconnect":
        pass
