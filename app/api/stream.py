"""The event stream of a task: WebSocket `/stream` and SSE `/events`, both over one implementation.

Both routes only serialise what `services.events.open_stream` yields. WebSocket
close codes: 1000 after `task.finished`; 4404 unknown (or not your) task; 4401
no or bad API key (4000 + the HTTP status of the error, in general); 4408 the
client fell too far behind: reconnect with `?after=<last seq you saw>`; 1011 a
server error: reconnect the same way. Idle streams get a `keepalive` message
(WebSocket) or a `: keepalive` comment (SSE) every `SANDHIVE_STREAM_KEEPALIVE_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Response, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from starlette.requests import HTTPConnection
from starlette.types import Send

from app.api.deps import Res, Resources, Tenant, current_tenant
from app.bus.fanout import LiveHub, SlowConsumer
from app.errors import AppError, NotFound
from app.services import events
from app.states import is_terminal

log = logging.getLogger(__name__)
router = APIRouter(tags=["events"])

CLOSE_DONE = 1000
CLOSE_SERVER_ERROR = 1011
CLOSE_NOT_FOUND = 4404
CLOSE_TOO_SLOW = 4408
CLOSE_WAIT_S = 10.0
SEQ_MAX = 2**31 - 1
"""`seq` is a Postgres integer: a larger `after` is a 422, not a database error."""
SSE_RETRY_MS = 2000
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

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
        async with events.open_stream(res.sessions, hub, tenant, task_id, after=after) as opened:
            return await _pump(ws, opened, task_id, after)
    except AppError as exc:
        code = 4000 + exc.status if 400 <= exc.status < 500 else CLOSE_SERVER_ERROR
        return code, exc.message[:100]
    except Exception:
        log.exception("event stream of %s failed", task_id)
        return CLOSE_SERVER_ERROR, "server error: reconnect with after=<last seq>"


@dataclass
class _Progress:
    last: int


async def _pump(ws: WebSocket, opened: events.TaskStream, task_id: str, after: int) -> Closing:
    """Send events while watching for the client leaving or falling behind."""
    progress = _Progress(after)
    sender = asyncio.create_task(_send_events(ws, opened.events, task_id, progress))
    watchers = [asyncio.create_task(_client_gone(ws)), asyncio.create_task(opened.cut_off.wait())]
    try:
        done, _ = await asyncio.wait([sender, *watchers], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sender, *watchers):
            task.cancel()
        await asyncio.gather(sender, *watchers, return_exceptions=True)
        await opened.events.aclose()
    too_slow = (CLOSE_TOO_SLOW, f"too slow: reconnect with after={progress.last}")
    if sender in done and not sender.cancelled():
        error = sender.exception()
        if error is None:
            return CLOSE_DONE, ""
        if isinstance(error, SlowConsumer):
            return too_slow
        if isinstance(error, WebSocketDisconnect):
            return None
        raise error
    return too_slow if opened.cut_off.is_set() else None


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


@router.get("/v1/tasks/{task_id}/events", response_class=StreamingResponse)
async def sse(
    task_id: str,
    res: Res,
    hub: Hub,
    tenant: Tenant,
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
    body = _sse_body(res, hub, tenant, task_id, start)
    return _EventStreamResponse(body, SSE_HEADERS)


class _EventStreamResponse(StreamingResponse):
    """Closes the event generator as soon as the response ends, even when the client left."""

    def __init__(self, content: AsyncGenerator[str, None], headers: dict[str, str]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self.body_generator = content

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self.body_generator.aclose()


async def _sse_body(
    res: Resources, hub: LiveHub, tenant: str, task_id: str, start: int
) -> AsyncGenerator[str, None]:
    yield f"retry: {SSE_RETRY_MS}\n\n"
    try:
        async with events.open_stream(res.sessions, hub, tenant, task_id, after=start) as opened:
            async for item in opened.events:
                yield _sse_frame(item)
    except (SlowConsumer, NotFound):
        return  # the response ends; an EventSource reconnects with Last-Event-ID


def _sse_frame(item: events.StreamEvent | None) -> str:
    if item is None:
        return ": keepalive\n\n"
    seq = f"id: {item.event.seq}\n" if item.event.seq is not None else ""
    return f"{seq}event: {item.event.type}\ndata: {item.json}\n\n"
