"""Durable events and the "replay, then follow" stream over them.

`record_event` numbers events under the task row's lock, so `seq` has no gaps
(invariant 3); `publish` copies an already-committed event to the task's live
Redis stream. `replay_then_follow` notes the live position first, replays
Postgres, then follows Redis, dropping what it already sent and filling any
gap from Postgres, so a reader resuming with `after=N` sees each event once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from redis.asyncio import Redis
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.bus import live
from app.db.models import Event, Task
from app.errors import NotFound
from app.ids import utc_now
from app.schemas import EventOut

FINISHED = "task.finished"


async def record_event(
    session: AsyncSession, task_id: str, type_: str, data: Mapping[str, Any]
) -> EventOut:
    """Insert the next durable event of a task, inside the caller's transaction."""
    seq = await session.scalar(
        update(Task)
        .where(Task.id == task_id)
        .values(last_seq=Task.last_seq + 1)
        .returning(Task.last_seq)
    )
    if seq is None:
        raise NotFound(f"no task {task_id}")
    row = Event(task_id=task_id, seq=seq, type=type_, ts=utc_now(), data=dict(data))
    session.add(row)
    await session.flush()
    return event_out(row)


def event_out(row: Event) -> EventOut:
    return EventOut(seq=row.seq, type=row.type, ts=row.ts, task_id=row.task_id, data=row.data)


def live_event(task_id: str, type_: str, data: Mapping[str, Any]) -> EventOut:
    """A live-only event: no seq, never stored."""
    return EventOut(seq=None, type=type_, ts=utc_now(), task_id=task_id, data=dict(data))


async def publish(redis: Redis, event: EventOut) -> None:
    """Send an event to live followers; call only after its transaction committed."""
    await live.publish(redis, event.task_id, event.model_dump_json())


async def replay_then_follow(
    sessions: async_sessionmaker[AsyncSession],
    redis: Redis,
    tenant: str,
    task_id: str,
    *,
    after: int = 0,
) -> AsyncIterator[EventOut | None]:
    """Every durable event with seq > after, then live ones; None marks an idle moment."""
    await check_visible(sessions, tenant, task_id)
    start = await live.position(redis, task_id)  # before the replay: nothing falls between
    last = after
    for event in await _durable_after(sessions, task_id, last):
        last = event.seq or last
        yield event
        if event.type == FINISHED:
            return
    async for payload in live.follow(redis, task_id, start):
        for event in await _next_events(sessions, task_id, payload, last):
            last = event.seq or last
            yield event
            if event.type == FINISHED:
                return
        if payload is None:
            yield None


async def _next_events(
    sessions: async_sessionmaker[AsyncSession], task_id: str, payload: str | None, last: int
) -> list[EventOut]:
    """What to send for one live payload (or an idle tick), in order, without repeats."""
    if payload is None:
        # Idle: catch up from Postgres in case a live publish was lost (Redis blip).
        return await _durable_after(sessions, task_id, last)
    event = EventOut.model_validate_json(payload)
    if event.seq is None:
        return [event]
    if event.seq <= last:
        return []
    if event.seq > last + 1:
        return await _durable_after(sessions, task_id, last, upto=event.seq)
    return [event]


async def _durable_after(
    sessions: async_sessionmaker[AsyncSession], task_id: str, after: int, upto: int | None = None
) -> list[EventOut]:
    query = select(Event).where(Event.task_id == task_id, Event.seq > after)
    if upto is not None:
        query = query.where(Event.seq <= upto)
    async with sessions() as session:
        rows = await session.scalars(query.order_by(Event.seq))
        return [event_out(row) for row in rows]


async def check_visible(
    sessions: async_sessionmaker[AsyncSession], tenant: str, task_id: str
) -> None:
    """NotFound unless the task exists and is the tenant's: never 403 (invariant 6)."""
    async with sessions() as session:
        found = await session.scalar(
            select(Task.id).where(Task.id == task_id, Task.tenant_id == tenant)
        )
    if found is None:
        raise NotFound(f"no task {task_id}")
