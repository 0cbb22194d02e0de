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
`SANDHIVE_STREAM_KEEPALIVE_S`. The plumbing shared with an experiment's stream is
app/api/streaming.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Response, WebSocket
from fastapi.responses import StreamingResponse
from starlette.requests import HTTPConnection
from starlette.types import Receive, Send

from app.api import streamcap, streaming
from app.api.deps import Res, Tenant
from app.api.query import known_query_only
from app.api.streaming import SEQ_MAX, Closing, Stopping
from app.bus.fanout import LiveHub, SlowConsumer
from app.errors import NotFound
from app.resources import Resources
from app.schemas.lines import one_line
from app.services import events
from app.states import is_terminal

router = APIRouter(tags=["events"])

CLOSE_TOO_SLOW = 4408

Opening = Callable[[], AbstractAsyncContextManager[events.TaskStream]]


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
    serving = functools.partial(_serve, ws, res, hub, task_id, after)
    await streaming.serve_websocket(ws, res, task_id, serving)


async def _serve(
    ws: WebSocket, res: Resources, hub: LiveHub, task_id: str, after: int, tenant: str
) -> Closing:
    async with events.open_stream(res.sessions, hub, tenant, task_id, after=after) as opened:
        return await _pump(ws, opened, task_id, after)


@dataclass
class _Progress:
    last: int


async def _pump(ws: WebSocket, opened: events.TaskStream, task_id: str, after: int) -> Closing:
    """Send events while watching for the client leaving or falling behind."""
    progress = _Progress(after)
    sender = await _race(
        opened, _send_events(ws, opened.events, task_id, progress), streaming.client_gone(ws)
    )
    too_slow = (CLOSE_TOO_SLOW, f"too slow: reconnect with after={progress.last}")
    if sender is None:
        return too_slow if opened.cut_off.is_set() else None
    if isinstance(sender.exception(), SlowConsumer):
        return too_slow
    return streaming.sender_closing(sender)


async def _race(
    opened: events.TaskStream,
    sending: Coroutine[Any, Any, None],
    *watching: Coroutine[Any, Any, object],
) -> asyncio.Task[None] | None:
    """`streaming.race`, with the viewer's cut-off for lagging as one more watcher, so that
    it is let go at once even while a send to it is blocked; the stream is closed on
    the way out."""
    try:
        return await streaming.race(sending, opened.cut_off.wait(), *watching)
    finally:
        await opened.events.aclose()


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
    EventSource to stop reconnecting. A viewer cut off for lagging, as a task gone
    meanwhile, just ends the response: the EventSource reconnects with Last-Event-ID.
    """
    start = last_event_id if last_event_id is not None else after
    status, last_seq = await events.visible_task(res.sessions, tenant, task_id)  # a clean 404
    if is_terminal(status) and last_seq <= start:
        return Response(status_code=204)
    slot = await streamcap.take_slot(res, tenant)  # 429 + Retry-After past the tenant's cap
    opening = functools.partial(events.open_stream, res.sessions, hub, tenant, task_id, after=start)
    pump = functools.partial(_sse_pump, opening)
    events_response = streaming.SseResponse(
        pump, stopping, ends=(SlowConsumer, NotFound), subject="event stream"
    )
    return streamcap.HoldingSlot(events_response, slot)


async def _sse_pump(
    opening: Opening, receive: Receive, send: Send, stopping: asyncio.Event
) -> None:
    """Send frames until task.finished, the client leaving, the viewer being cut off, or
    the server stopping."""
    async with opening() as opened:
        sender = await _race(
            opened,
            _sse_send_events(send, opened.events),
            streaming.request_gone(receive),
            stopping.wait(),
        )
        if sender is not None:
            sender.result()  # SlowConsumer, or a server error for the caller to see


async def _sse_send_events(
    send: Send, stream_events: AsyncIterator[events.StreamEvent | None]
) -> None:
    async for item in stream_events:
        await streaming.sse_send(send, _sse_frame(item))


def _sse_frame(item: events.StreamEvent | None) -> str:
    if item is None:
        return ": keepalive\n\n"
    seq = f"id: {item.event.seq}\n" if item.event.seq is not None else ""
    return f"{seq}event: {item.event.type}\ndata: {one_line(item.json)}\n\n"
