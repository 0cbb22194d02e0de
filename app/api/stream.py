"""The event stream of a task: WebSocket `/stream` and SSE `/events`, one implementation below.

Both routes only serialise what `services.events.replay_then_follow` yields.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse

from app.api.deps import Res, Tenant
from app.errors import NotFound
from app.schemas import EventOut
from app.services import events

router = APIRouter(tags=["events"])
CLOSE_NOT_FOUND = 4404


@router.websocket("/v1/tasks/{task_id}/stream")
async def stream(
    ws: WebSocket, task_id: str, res: Res, tenant: Tenant, after: Annotated[int, Query(ge=0)] = 0
) -> None:
    """Replay durable events after `after`, then follow live; close 1000 after task.finished."""
    await ws.accept()
    followed = events.replay_then_follow(res.sessions, res.redis, tenant, task_id, after=after)
    try:
        async for event in followed:
            if event is not None:
                await ws.send_text(event.model_dump_json())
    except NotFound:
        await ws.close(code=CLOSE_NOT_FOUND, reason="task not found")
        return
    except WebSocketDisconnect:
        return
    await ws.close(code=1000)


@router.get("/v1/tasks/{task_id}/events", response_class=StreamingResponse)
async def sse(
    task_id: str,
    res: Res,
    tenant: Tenant,
    after: Annotated[int, Query(ge=0)] = 0,
    last_event_id: Annotated[int | None, Header(ge=0)] = None,
) -> StreamingResponse:
    """The same events as Server-Sent Events; `Last-Event-ID` wins over `after`."""
    start = last_event_id if last_event_id is not None else after
    await events.check_visible(res.sessions, tenant, task_id)  # a clean 404 before streaming
    followed = events.replay_then_follow(res.sessions, res.redis, tenant, task_id, after=start)
    return StreamingResponse(_sse_lines(followed), media_type="text/event-stream")


async def _sse_lines(followed: AsyncIterator[EventOut | None]) -> AsyncIterator[str]:
    async for item in followed:
        if item is None:
            yield ": keepalive\n\n"
            continue
        seq = f"id: {item.seq}\n" if item.seq is not None else ""
        yield f"{seq}event: {item.type}\ndata: {item.model_dump_json()}\n\n"
