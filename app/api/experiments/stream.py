"""An experiment's event stream: SSE `/v1/experiments/{id}/events` and WebSocket
`/v1/experiments/{id}/stream`, both over `services.experiment_events.follow_experiment`.

They behave as a task's stream routes do (app/api/tasks/stream.py), over the same plumbing
(app/api/streaming.py): the same auth (a WebSocket's key in `?token=` too), the tenant's
open-stream cap (`app.api.streamcap`: SSE 429, WebSocket 4429), keepalives every
`SANDHIVE_STREAM_KEEPALIVE_S`, 503 + Retry-After (WebSocket 1013) while Postgres is
unreachable, and close codes 1000 once the experiment is done, 4404 for an unknown (or
another tenant's) experiment, 4401 without a valid key. Resume with `Last-Event-ID` (SSE)
or `?after=<last seq>`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response, WebSocket
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Send

from app.api import streamcap, streaming
from app.api.deps import Res, Tenant
from app.api.query import known_query_only
from app.api.streaming import SEQ_MAX, Closing, Stopping
from app.errors import AppError
from app.resources import Resources
from app.schemas.lines import one_line
from app.schemas.tasks import ErrorOut
from app.services.experiments import events as experiment_events
from app.services.experiments.events import ExperimentFrame

router = APIRouter(tags=["experiments"])

Frames = AsyncGenerator[ExperimentFrame | None, None]
Opening = Callable[[], AbstractAsyncContextManager[Frames]]


def _opening(res: Resources, tenant: str, experiment_id: str, after: int) -> Opening:
    s = res.settings

    def opening() -> AbstractAsyncContextManager[Frames]:
        return experiment_events.follow_experiment(
            res.sessions,
            res.redis,
            tenant,
            experiment_id,
            after=after,
            poll_s=min(s.experiment_stream_poll_s, s.stream_keepalive_s),
            keepalive_s=s.stream_keepalive_s,
        )

    return opening


@router.websocket("/v1/experiments/{experiment_id}/stream")
async def stream(
    ws: WebSocket,
    experiment_id: str,
    res: Res,
    after: Annotated[int, Query(ge=0, le=SEQ_MAX)] = 0,
) -> None:
    """Replay the experiment's events after `after`, then follow; close 1000 once done."""
    serving = functools.partial(_serve, ws, res, experiment_id, after)
    await streaming.serve_websocket(ws, res, experiment_id, serving)


async def _serve(
    ws: WebSocket, res: Resources, experiment_id: str, after: int, tenant: str
) -> Closing:
    async with _opening(res, tenant, experiment_id, after)() as frames:
        sender = await streaming.race(_send_frames(ws, frames), streaming.client_gone(ws))
    return None if sender is None else streaming.sender_closing(sender)  # None: the client left


async def _send_frames(ws: WebSocket, frames: AsyncIterator[ExperimentFrame | None]) -> None:
    async for frame in frames:
        await ws.send_text((frame or experiment_events.keepalive()).json)


@router.get(
    "/v1/experiments/{experiment_id}/events",
    response_class=StreamingResponse,
    dependencies=[known_query_only("token")],
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "The events, then more"},
        204: {"description": "The experiment is done and nothing follows `after`"},
        **{code: {"model": ErrorOut} for code in (401, 404, 422, 429, 503)},
    },
)
async def sse(
    experiment_id: str,
    res: Res,
    tenant: Tenant,
    stopping: Stopping,
    after: Annotated[int, Query(ge=0, le=SEQ_MAX)] = 0,
    last_event_id: Annotated[int | None, Header(ge=0, le=SEQ_MAX)] = None,
) -> Response:
    """The same events as Server-Sent Events; `Last-Event-ID` wins over `after`.

    A done experiment with nothing after that point answers 204, which tells an
    EventSource to stop reconnecting; one gone meanwhile just ends the response.
    """
    start = last_event_id if last_event_id is not None else after
    head = await experiment_events.experiment_head(res.sessions, tenant, experiment_id)
    if head.done_after(start):
        return Response(status_code=204)
    slot = await streamcap.take_slot(res, tenant)  # 429 + Retry-After past the tenant's cap
    pump = functools.partial(_sse_pump, _opening(res, tenant, experiment_id, start))
    events_response = streaming.SseResponse(
        pump, stopping, ends=(AppError,), subject="experiment event stream"
    )
    return streamcap.HoldingSlot(events_response, slot)


async def _sse_pump(
    opening: Opening, receive: Receive, send: Send, stopping: asyncio.Event
) -> None:
    async with opening() as frames:
        sender = await streaming.race(
            _sse_send_frames(send, frames), streaming.request_gone(receive), stopping.wait()
        )
    if sender is not None:
        sender.result()  # a server error for the caller to see


async def _sse_send_frames(send: Send, frames: AsyncIterator[ExperimentFrame | None]) -> None:
    async for frame in frames:
        await streaming.sse_send(send, _sse_frame(frame))


def _sse_frame(frame: ExperimentFrame | None) -> str:
    if frame is None:
        return ": keepalive\n\n"
    return f"id: {frame.event.seq}\nevent: {frame.event.type}\ndata: {one_line(frame.json)}\n\n"
