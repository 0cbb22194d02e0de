"""Durable events and the one "replay, then follow" stream over them.

`record_event` numbers events under the task row's lock, so `seq` has no gaps
(invariant 3); `publish` copies an already-committed event to the task's live
Redis stream. `open_stream` is what both the WebSocket and the SSE route serve:
it joins the process's live feed of the task *first*, then replays Postgres
after `after`, then follows the feed, dropping what it already sent and
filling any gap from Postgres, so a reader resuming with `after=N` sees each
durable event once, in order. A finished task is replayed without any feed.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from redis.asyncio import Redis
from sqlalchemy import ColumnElement, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.bus import live
from app.bus.fanout import LiveHub, Subscription
from app.db.engine import Sessions
from app.db.models import EVENTS, TASKS, Event, Task
from app.errors import NotFound
from app.ids import utc_now
from app.schemas.tasks import EventOut
from app.services.visibility import found, visible
from app.states import TaskStatus, is_terminal

TASK_FINISHED = "task.finished"
KEEPALIVE = "keepalive"
REPLAY_BATCH = 200
PARSED_CACHE = 64
"""Live payloads parsed once per process, not once per viewer (they share one feed)."""


async def record_event(
    session: AsyncSession, task_id: str, type_: str, data: Mapping[str, Any]
) -> EventOut:
    """Insert the next durable event of a task, inside the caller's transaction."""
    (event,) = await record_events(session, task_id, [(type_, data)])
    return event


async def record_events(
    session: AsyncSession,
    task_id: str,
    items: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    only_if: ColumnElement[bool] | None = None,
) -> list[EventOut]:
    """Insert the task's next durable events, in order, inside the caller's transaction.

    Two round trips whatever the count (one seq bump, one insert): this is on every
    step's path. `only_if`, a condition on the task row, makes the bump (and so the
    insert) happen only when it holds; None is returned as an empty list then.
    """
    # Core statements on the session's connection: the ORM's bulk paths cost more CPU
    # than the round trips themselves. So a Task loaded in this session keeps its old
    # `last_seq`: read the seq from the database, never from that object.
    conn = await session.connection()
    table = TASKS
    bump = update(table).where(table.c.id == task_id)
    if only_if is not None:
        bump = bump.where(only_if)
    bump = bump.values(last_seq=table.c.last_seq + len(items)).returning(table.c.last_seq)
    last = (await conn.execute(bump)).scalar()
    if last is None:
        if only_if is not None:
            return []
        raise NotFound(f"no task {task_id}")
    now = utc_now()
    first = last - len(items) + 1
    rows = [
        {"task_id": task_id, "seq": first + i, "type": type_, "ts": now, "data": dict(data)}
        for i, (type_, data) in enumerate(items)
    ]
    await conn.execute(insert(EVENTS), rows)
    return [
        EventOut(seq=r["seq"], type=r["type"], ts=now, task_id=task_id, data=r["data"])
        for r in rows
    ]


def event_out(row: Event) -> EventOut:
    return EventOut(seq=row.seq, type=row.type, ts=row.ts, task_id=row.task_id, data=row.data)


def live_event(task_id: str, type_: str, data: Mapping[str, Any]) -> EventOut:
    """A live-only event: no seq, never stored."""
    return EventOut(seq=None, type=type_, ts=utc_now(), task_id=task_id, data=dict(data))


async def publish(redis: Redis, *events: EventOut) -> None:
    """Send events (of one task, in order) to live followers in one Redis round trip;
    durable ones only after their transaction committed."""
    if not events:
        return
    finished = any(event.type == TASK_FINISHED for event in events)
    payloads = [event.model_dump_json() for event in events]
    await live.publish(redis, events[0].task_id, payloads, expire=finished)


E = TypeVar("E", bound=BaseModel)


@dataclass(frozen=True)
class Frame(Generic[E]):
    """One event to send, with its JSON text (computed once, shared by every viewer); a
    task's (`StreamEvent`) or an experiment's (`experiment_events.ExperimentFrame`)."""

    event: E
    json: str

    @classmethod
    def of(cls, event: E) -> Frame[E]:
        return cls(event, event.model_dump_json())


StreamEvent = Frame[EventOut]


@dataclass(frozen=True)
class TaskStream:
    """What a stream route serves: events in order (None = idle tick) and a cut-off signal."""

    events: AsyncGenerator[StreamEvent | None, None]
    cut_off: asyncio.Event
    """Set when this viewer fell too far behind; `events` then raises SlowConsumer."""


@asynccontextmanager
async def open_stream(
    sessions: Sessions, hub: LiveHub, tenant: str, task_id: str, *, after: int = 0
) -> AsyncIterator[TaskStream]:
    """Every durable event with seq > after, then live ones until task.finished.

    NotFound (before anything is sent) for an unknown task or another tenant's.
    """
    status, _ = await visible_task(sessions, tenant, task_id)
    if is_terminal(status):
        # Its task.finished committed with the status: the replay holds everything.
        yield TaskStream(_replay(sessions, task_id, after), asyncio.Event())
        return
    async with hub.subscribe(task_id) as sub:  # joined before the replay: no gap
        # A viewer from the start also gets the running step's live events so far (a
        # resuming one had its chance at them, and the page cannot tell them apart).
        in_flight = functools.partial(hub.in_flight, task_id, sub) if after == 0 else None
        yield TaskStream(_replay_then_follow(sessions, sub, task_id, after, in_flight), sub.cut_off)


def keepalive(task_id: str) -> StreamEvent:
    """The live-only message a WebSocket gets on idle ticks, so proxies and clients see life."""
    return StreamEvent.of(live_event(task_id, KEEPALIVE, {}))


async def _replay(
    sessions: Sessions, task_id: str, after: int
) -> AsyncGenerator[StreamEvent, None]:
    """Durable events after `after` from Postgres, in batches, ending at task.finished."""
    last = after
    while True:
        batch = await _durable_after(sessions, task_id, last, limit=REPLAY_BATCH)
        for event in batch:
            last = event.seq or last
            yield StreamEvent.of(event)
            if event.type == TASK_FINISHED:
                return
        if len(batch) < REPLAY_BATCH:
            return


async def _replay_then_follow(
    sessions: Sessions,
    sub: Subscription,
    task_id: str,
    after: int,
    in_flight: Callable[[], Awaitable[list[str]]] | None = None,
) -> AsyncGenerator[StreamEvent | None, None]:
    """The replay, then (`in_flight`, a viewer from the start) the live-only events of the
    step running when it joined, then what is published after it joined."""
    last = after
    async for item in _replay(sessions, task_id, after):
        last = item.event.seq or last
        yield item
        if item.event.type == TASK_FINISHED:
            return
    for missed in await in_flight() if in_flight is not None else []:
        yield _parsed(missed)
    while True:
        payload = await sub.next()
        for item in await _next_events(sessions, task_id, payload, last):
            last = item.event.seq or last
            yield item
            if item.event.type == TASK_FINISHED:
                return
        if payload is None:
            yield None


async def _next_events(
    sessions: Sessions, task_id: str, payload: str | None, last: int
) -> list[StreamEvent]:
    """What to send for one live payload (or an idle tick), in order, without repeats."""
    if payload is None:
        # Idle: catch up from Postgres in case a live publish was lost (Redis blip).
        return [StreamEvent.of(e) for e in await _durable_after(sessions, task_id, last)]
    item = _parsed(payload)
    seq = item.event.seq
    if seq is None or seq == last + 1:
        return [item]
    if seq <= last:
        return []
    gap = await _durable_after(sessions, task_id, last, upto=seq)
    return [StreamEvent.of(e) for e in gap]


@functools.lru_cache(maxsize=PARSED_CACHE)
def _parsed(payload: str) -> StreamEvent:
    """A published payload is the event's JSON already: parse it, send it as it came."""
    return StreamEvent(EventOut.model_validate_json(payload), payload)


async def _durable_after(
    sessions: Sessions,
    task_id: str,
    after: int,
    *,
    upto: int | None = None,
    limit: int | None = None,
) -> list[EventOut]:
    query = select(Event).where(Event.task_id == task_id, Event.seq > after)
    if upto is not None:
        query = query.where(Event.seq <= upto)
    query = query.order_by(Event.seq)
    if limit is not None:
        query = query.limit(limit)
    async with sessions() as session:
        rows = await session.scalars(query)
        return [event_out(row) for row in rows]


async def visible_task(sessions: Sessions, tenant: str, task_id: str) -> tuple[TaskStatus, int]:
    """The task's status and last seq; NotFound unless it exists and is the tenant's (inv. 6)."""
    query = select(Task.status, Task.last_seq).where(visible(task_id, tenant))
    async with sessions() as session:
        row = found((await session.execute(query)).first(), task_id)
    return TaskStatus(row[0]), int(row[1])


async def check_visible(sessions: Sessions, tenant: str, task_id: str) -> None:
    """NotFound unless the task exists and is the tenant's: never 403 (invariant 6)."""
    await visible_task(sessions, tenant, task_id)
