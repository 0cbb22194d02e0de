"""An experiment's durable events: numbered under the experiment's row, no gaps.

Written in the same transaction as the state change they report (an item started, ended
or scored; the experiment finished, cancelled or regraded), so a reader that replays
`experiment_events` after `seq` and then follows the live feed sees each one once, in
order, like a task's events (invariant 3).

`follow_experiment` is what both stream routes serve. Unlike a task's stream it has no
live copy of the events to fan out: a wake-up on Redis pub/sub (`app.bus.experiment_live`)
only says "read Postgres after your seq now", so each viewer sends exactly what is
committed, in order, and a lost wake-up costs one poll interval.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError
from sqlalchemy import exists, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.bus import keys
from app.db import models
from app.db.engine import Sessions
from app.errors import NotFound
from app.ids import utc_now
from app.schemas.experiments import ExperimentEventOut
from app.services.events import Frame

log = logging.getLogger(__name__)
Exp = models.Experiment
EVENTS = models.ExperimentEvent
ITEMS = models.ExperimentItem


async def record_experiment_events(
    session: AsyncSession,
    experiment_id: str,
    items: Sequence[tuple[str, Mapping[str, Any]]],
) -> list[models.ExperimentEvent]:
    """Insert the experiment's next events, in order, inside the caller's transaction.

    The bump of `experiments.event_seq` takes the experiment's row lock (if the caller does
    not hold it already), so two writers never get the same `seq`.
    """
    if not items:
        return []
    last = await session.scalar(
        update(Exp)
        .where(Exp.id == experiment_id)
        .values(event_seq=Exp.event_seq + len(items))
        .returning(Exp.event_seq)
        .execution_options(synchronize_session=False)
    )
    if last is None:
        raise LookupError(f"no experiment {experiment_id}")
    first = int(last) - len(items) + 1
    now = utc_now()
    rows = [
        {
            "experiment_id": experiment_id,
            "seq": first + i,
            "type": type_,
            "ts": now,
            "data": dict(data),
        }
        for i, (type_, data) in enumerate(items)
    ]
    await session.execute(insert(EVENTS), rows)
    return [models.ExperimentEvent(**row) for row in rows]


# Following an experiment: replay Postgres after a seq, then wait for wake-ups (or a poll)


TERMINAL = frozenset({"experiment.finished", "experiment.cancelled"})
ENDED = frozenset({"finished", "cancelled"})
ITEM_WORK_LEFT = ("pending", "running", "scoring")
"""Item statuses that still record an event (`experiment_runner.WORK_LEFT`)."""
KEEPALIVE = "keepalive"
REPLAY_BATCH = 200


ExperimentFrame = Frame[ExperimentEventOut]
"""One event to send, with its JSON text."""


def keepalive() -> ExperimentFrame:
    """The live-only message an idle WebSocket gets (seq None, never stored)."""
    return ExperimentFrame.of(ExperimentEventOut(seq=None, type=KEEPALIVE, ts=utc_now(), data={}))


@dataclass(frozen=True)
class Head:
    """Where an experiment's events stand: its status, last seq, whether that last event
    ends a stream, and whether any item may still record one."""

    status: str
    last_seq: int
    last_terminal: bool
    work_left: bool

    def done_after(self, seq: int) -> bool:
        """Nothing more will come after `seq`: the experiment is no longer running and its
        last event was sent, that event being `experiment.finished`/`.cancelled` or no item
        being left to end (after a cancel, the items that were running end after the
        `experiment.cancelled`). A regrade runs a finished experiment again, recording
        events after its `experiment.finished`, so the status alone is not enough."""
        if self.status not in ENDED or seq < self.last_seq:
            return False
        return self.last_terminal or not self.work_left


async def experiment_head(sessions: Sessions, tenant: str, experiment_id: str) -> Head:
    """NotFound unless the experiment exists and is the tenant's (invariant 6)."""
    async with sessions() as session:
        return await _head(session, tenant, experiment_id)


async def _head(session: AsyncSession, tenant: str, experiment_id: str) -> Head:
    # Work left first: an item that ends after this read has its event after the seq read
    # next, so "no work left" never hides an event; a regrade shows in the status read next.
    work_left = await session.scalar(
        select(
            exists().where(ITEMS.experiment_id == experiment_id, ITEMS.status.in_(ITEM_WORK_LEFT))
        )
    )
    found = (
        await session.execute(
            select(Exp.status, Exp.event_seq).where(
                Exp.id == experiment_id, Exp.tenant_id == tenant
            )
        )
    ).first()
    if found is None:
        raise NotFound(f"no experiment {experiment_id}")
    status, last_seq = str(found[0]), int(found[1])
    last_type = await session.scalar(
        select(EVENTS.type).where(EVENTS.experiment_id == experiment_id, EVENTS.seq == last_seq)
    )
    return Head(status, last_seq, last_type in TERMINAL, bool(work_left))


@asynccontextmanager
async def follow_experiment(
    sessions: Sessions,
    redis: Redis,
    tenant: str,
    experiment_id: str,
    *,
    after: int,
    poll_s: float,
    keepalive_s: float,
) -> AsyncIterator[AsyncGenerator[ExperimentFrame | None, None]]:
    """Every event with seq > after, in order and once each, until the experiment is done
    (`Head.done_after`); None after every `keepalive_s` with nothing to send.

    NotFound before anything is sent. Subscribed to the wake-ups before the first read, so
    no commit falls between; Postgres is re-read after `poll_s` without one. A Redis outage
    only slows the stream to polling (the events are all in Postgres); a Postgres one ends
    it with the error (the routes' 503 / 1013).
    """
    await experiment_head(sessions, tenant, experiment_id)
    async with _Wakeups(redis, keys.experiment_events(experiment_id)) as wakeups:
        frames = _follow(sessions, wakeups, tenant, experiment_id, after, poll_s, keepalive_s)
        try:
            yield frames
        finally:
            await frames.aclose()


async def _follow(
    sessions: Sessions,
    wakeups: _Wakeups,
    tenant: str,
    experiment_id: str,
    after: int,
    poll_s: float,
    keepalive_s: float,
) -> AsyncGenerator[ExperimentFrame | None, None]:
    last = after
    quiet_since = time.monotonic()
    while True:
        async with sessions() as session:
            head = await _head(session, tenant, experiment_id)  # before the batch: see done_after
            batch = await _events_after(session, experiment_id, last)
        for event in batch:
            last = event.seq or last
            yield ExperimentFrame.of(event)
        if batch:
            quiet_since = time.monotonic()
            if len(batch) == REPLAY_BATCH:
                continue
        if head.done_after(last):
            return
        if time.monotonic() - quiet_since >= keepalive_s:
            yield None
            quiet_since = time.monotonic()
        left = keepalive_s - (time.monotonic() - quiet_since)
        await wakeups.wait(max(0.0, min(poll_s, left)))


async def _events_after(
    session: AsyncSession, experiment_id: str, after: int
) -> list[ExperimentEventOut]:
    rows = await session.scalars(
        select(EVENTS)
        .where(EVENTS.experiment_id == experiment_id, EVENTS.seq > after)
        .order_by(EVENTS.seq)
        .limit(REPLAY_BATCH)
    )
    return [
        ExperimentEventOut(seq=row.seq, type=row.type, ts=row.ts, data=row.data) for row in rows
    ]


class _Wakeups:
    """A subscription to an experiment's wake-up channel; without Redis, plain sleeps.

    A wake-up only says "read Postgres now": every message waiting is taken at once, and
    one read serves them all.
    """

    def __init__(self, redis: Redis, channel: str) -> None:
        self._redis = redis
        self._channel = channel
        self._pubsub: PubSub | None = None

    async def __aenter__(self) -> _Wakeups:
        await self._subscribe()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    async def _subscribe(self) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self._channel)
        except (RedisError, OSError) as exc:
            log.warning("experiment events: no wake-ups (%r), polling Postgres", exc)
            await _close_quietly(pubsub)
            return
        self._pubsub = pubsub

    async def wait(self, timeout_s: float) -> None:
        """Until a wake-up comes or `timeout_s` passes."""
        if self._pubsub is None:
            await asyncio.sleep(timeout_s)
            await self._subscribe()  # Redis may be back
            return
        try:
            message = await self._pubsub.get_message(timeout=timeout_s)
            while message is not None:
                message = await self._pubsub.get_message(timeout=0)
        except (RedisError, OSError) as exc:
            log.warning("experiment events: wake-ups lost (%r), polling Postgres", exc)
            await self._close()

    async def _close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            await _close_quietly(pubsub)


async def _close_quietly(pubsub: PubSub) -> None:
    try:
        await pubsub.aclose()
    except (RedisError, OSError) as exc:
        log.debug("closing a pub/sub connection: %r", exc)
