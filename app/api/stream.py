"""The event stream of a task: WebSocket `/stream` and SSE `/events`, both over one implementation.

Both routes only serialise what `services.events.open_stream` yields. WebSocket
close codes: 1000 after `task.finished`; 4404 unknown (or not your) task; 4401
no or bad API key (4000 + the HTTP status of the error, in general); 4429 over
the request rate or the tenant's open-stream cap (SSE: 429); 4408 the
client fell too far behind: reconnect with `?after=<last seq you saw>`; 1013
Postgres or Redis is unreachable (SSE: 503 + Retry-After before the stream
starts; a stream already running just ends): reconnect the same way a few
seconds later; 1011 a server error: reconnect the same way. Idle streams get a
`keepalive` message (WebSocket) or a `: keepalive` comment (SSE) every
`SANDHIVE_STREAM_KEEPALIVE_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Response, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from starlette.requests import HTTPConnection
from starlette.types import Receive, Scope, Send

from app import outage
from app.api import streamcap
from app.api.deps import Res, Tenant, current_tenant
from app.api.query import known_query_only
from app.bus.fanout import LiveHub, SlowConsumer
from app.errors import AppError, NotFound
from app.resources import Resources
from app.services import events
from app.states import is_terminal

log = logging.getLogger(__name__)
router = APIRouter(tags=["events"])

CLOSE_DONE = 1000
CLOSE_SERVER_ERROR = 1011
CLOSE_TRY_AGAIN = 1013
"""RFC 6455 "try again later": a backend the stream needs is unreachable."""
CLOSE_NOT_FOUND = 4404
CLOSE_TOO_SLOW = 4408
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


@contextlib.asynccontextmanager
async def open_hub(res: Resources) -> AsyncIterator[LiveHub]:
    """The process's live feeds, for the app's lifespan; every reader stops on the way out."""
    hub = LiveHub(
        res.redis,
        buffer=res.settings.stream_client_buffer,
        tick_s=res.settings.stream_keepalive_s,
    )
    try:
        yield hub
    finally:
        await hub.aclose()


def get_hub(conn: HTTPConnection) -> LiveHub:
    hub: LiveHub = conn.state.hub
    return hub


Hub = Annotated[LiveHub, Depends(get_hub)]


def get_stopping(conn: HTTPConnection) -> asyncio.Event:
    stopping: asyncio.Event = getattr(conn.state, STOPPING)
    return stopping


Stopping = Annotated[asyncio.Event, Depends(get_stopping)]


@router.websocket("/v1/tasks/{task_id}/stream")
async def stream(
    ws: WebSocket,
    task_id: str,
    res: Res,
    hub: Hub,
    after: Annotated[int, Query(ge=0, le=SEQ_MAX)] = 0,
) -> None:
    """Replay durable events after `after`, then follow live; close 1000 after task.finished."""
    await ws.accept()
    closing = await _serve(ws, res, hub, task_id, after)
    if closing is not None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError, TimeoutError):
            await asyncio.wait_for(ws.close(*closing), CLOSE_WAIT_S)


async def _serve(ws: WebSocket, res: Resources, hub: LiveHub, task_id: str, after: int) -> Closing:
    try:
        tenant = await current_tenant(ws, res)  # here, not a dependency: errors become close codes
        async with (
            streamcap.stream_slot(res, tenant),  # 4429 past the tenant's open-stream cap
            events.open_stream(res.sessions, hub, tenant, task_id, after=after) as opened,
        ):
            return await _pump(ws, opened, task_id, after)
    except AppError as exc:
        return _closing_for(exc)
    except Exception as exc:
        if (down := outage.unavailable(exc, res.settings.unavailable_retry_after_s)) is not None:
            log.warning("event stream of %s: %s (%r)", task_id, down.code, exc)
            return _closing_for(down)
        log.exception("event stream of %s failed", task_id)
        return CLOSE_SERVER_ERROR, "server error: reconnect with after=<last seq>"


def _closing_for(exc: AppError) -> tuple[int, str]:
    """4000 + the status of a refusal, 1013 for an outage (503), 1011 for the rest."""
    if 400 <= exc.status < 500:
        return 4000 + exc.status, exc.message[:100]
    return (CLOSE_TRY_AGAIN if exc.status == 503 else CLOSE_SERVER_ERROR), exc.message[:100]


@dataclass
class _Progress:
    last: int


async def _pump(ws: WebSocket, opened: events.TaskStream, task_id: str, after: int) -> Closing:
    """Send events while watching for the client leaving or falling behind."""
    progress = _Progress(after)
    sender = await _race(
        opened, _send_events(ws, opened.events, task_id, progress), _client_gone(ws)
    )
    too_slow = (CLOSE_TOO_SLOW, f"too slow: reconnect with after={progress.last}")
    if sender is not None:
        error = sender.exception()
        if error is None:
            return CLOSE_DONE, ""
        if isinstance(error, SlowConsumer):
            return too_slow
        if isinstance(error, WebSocketDisconnect):
            return None
        raise error
    return too_slow if opened.cut_off.is_set() else None


async def _race(
    opened: events.TaskStream,
    sending: Coroutine[Any, Any, None],
    *watching: Coroutine[Any, Any, object],
) -> asyncio.Task[None] | None:
    """Send until done, or until a watcher (or the viewer's cut-off) fires first.

    The send runs as a task so that a viewer cut off for lagging is let go at
    once, even while a send to it is blocked (for a stalled client it never
    returns). Everything is cancelled and the stream closed on the way out.
    Returns the sender's task if it ended first (its result or error to read).
    """
    sender = asyncio.create_task(sending)
    watchers = [asyncio.create_task(w) for w in (opened.cut_off.wait(), *watching)]
    try:
        done, _ = await asyncio.wait([sender, *watchers], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sender, *watchers):
            task.cancel()
        await asyncio.gather(sender, *watchers, return_exceptions=True)
        await opened.events.aclose()
    return sender if sender in done and not sender.cancelled() else None


async def _send_events(
    ws: WebSocket,
    stream_events: AsyncIterator[events.StreamEvent | None],
    task_id: str,
    progress: _Progress,
) -> None:
    async for item in stream_events:
        await ws.send_text((item or events.keepalive(task_id)).json)
        if item is not None and item.event.seq is not None:
            progress.last = item.event.seq


async def _client_gone(ws: WebSocket) -> None:
    """Read (and ignore) what the client sends until it disconnects; keeps pongs flowing."""
    while (await ws.receive())["type"] != "websocket.disconnect":
        pass


@router.get(
    "/v1/tasks/{task_id}/events",
    response_class=StreamingResponse,
    dependencies=[known_query_only("token")],  # a key where headers cannot go (presented_key)
)
async def sse(
    task_id: str,
    res: Res,
    hub: Hub,
    tenant: Tenant,
    stopping: Stopping,
    after: Annotated[int, Query(ge=0, le=SEQ_MAX)] = 0,
    last_event_id: Annotated[int | None, Header(ge=0, le=SEQ_MAX)] = None,
) -> Response:
    """The same events as Server-Sent Events; `Last-Event-ID` wins over `after`.

    A finished task with nothing after that point answers 204, which tells an
    EventSource to stop reconnecting.
    """
    start = last_event_id if last_event_id is not None else after
    status, last_seq = await events.visible_task(res.sessions, tenant, task_id)  # a clean 404
    if is_terminal(status) and last_seq <= start:
        return Response(status_code=204)
    slot = await streamcap.take_slot(res, tenant)  # 429 + Retry-After past the tenant's cap
    opening = functools.partial(events.open_stream, res.sessions, hub, tenant, task_id, after=start)
    return streamcap.HoldingSlot(_EventStreamResponse(opening, stopping), slot)


class _EventStreamResponse(Response):
    """One task's stream as Server-Sent Events, raced against the client leaving or lagging
    and the server stopping.

    As for the WebSocket, the sending is raced (`_race`) against the viewer's
    cut-off signal: a plain StreamingResponse would hold a stalled viewer in the
    hub for as long as its blocked send. The response then ends and an
    EventSource reconnects with Last-Event-ID; a client that does not take even
    that end within CLOSE_WAIT_S has its connection closed (uvicorn logs it).
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        opening: Callable[[], AbstractAsyncContextManager[events.TaskStream]],
        stopping: asyncio.Event,
    ) -> None:
        # Not Response.__init__: no body, so no Content-Length (as StreamingResponse does).
        self.status_code = 200
        self.background = None
        self.init_headers(SSE_HEADERS)
        self._opening = opening
        self._stopping = stopping

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        with contextlib.suppress(OSError):  # an ASGI 2.4 server's word for a client gone
            await _sse_send(send, f"retry: {SSE_RETRY_MS}\n\n")
            await _sse_pump(self._opening, self._stopping, receive, send)
        end = {"type": "http.response.body", "body": b"", "more_body": False}
        with contextlib.suppress(OSError, TimeoutError):
            # Stopping: a stalled client must not hold the exit for the graceful window.
            wait_s = STOPPING_CLOSE_WAIT_S if self._stopping.is_set() else CLOSE_WAIT_S
            await asyncio.wait_for(send(end), wait_s)


async def _sse_pump(
    opening: Callable[[], AbstractAsyncContextManager[events.TaskStream]],
    stopping: asyncio.Event,
    receive: Receive,
    send: Send,
) -> None:
    """Send frames until task.finished, the client leaving, the viewer being cut off, or
    the server stopping."""
    try:
        async with opening() as opened:
            sender = await _race(
                opened,
                _sse_send_events(send, opened.events),
                _request_gone(receive),
                stopping.wait(),
            )
            if sender is not None:
                sender.result()  # SlowConsumer, or a server error for the caller to see
    except (SlowConsumer, NotFound):
        return  # the response ends; an EventSource reconnects with Last-Event-ID
    except Exception as exc:
        if (backend := outage.backend_down(exc)) is None:
            raise
        # Too late for a 503: end the response; the reconnect gets the 503 if still down.
        log.warning("event stream ended: %s is unreachable (%r)", backend, exc)


async def _sse_send_events(
    send: Send, stream_events: AsyncIterator[events.StreamEvent | None]
) -> None:
    async for item in stream_events:
        await _sse_send(send, _sse_frame(item))


async def _sse_send(send: Send, text: str) -> None:
    await send({"type": "http.response.body", "body": text.encode(), "more_body": True})


async def _request_gone(receive: Receive) -> None:
    """Wait for the HTTP client to disconnect (ASGI `http.disconnect`)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _sse_frame(item: events.StreamEvent | None) -> str:
    if item is None:
        return ": keepalive\n\n"
    seq = f"id: {item.event.seq}\n" if item.event.seq is not None else ""
    return f"{seq}event: {item.event.type}\ndata: {item.json}\n\n"
