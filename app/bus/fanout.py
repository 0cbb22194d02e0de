"""One Redis reader per watched task per process, fanned out to bounded per-viewer buffers.

Used by `app.services.events` for the API's event streams: a hundred viewers of
a task cost one blocking XREAD, not a hundred. The reader hands every entry to
every subscriber synchronously, so joining is atomic with respect to delivery:
a subscriber gets every entry published after it joined (and after the feed's
starting position was noted), which is what lets the caller replay Postgres
*after* joining and miss nothing. A subscriber more than `buffer` items behind
is cut off (`SlowConsumer`) instead of slowing the reader or the other viewers;
the hub counts such viewers and the payloads they never got (`losses`, for the
API's `/metrics`).
Every `tick_s` each subscriber also receives `None`: an idle tick, used for
keepalives and to catch up from Postgres if a publish was lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app import defaults
from app.bus import live
from app.kit import cancelling

log = logging.getLogger(__name__)


class SlowConsumer(Exception):
    """The viewer fell too far behind and was dropped; it should resume from its last seq."""


class Subscription:
    """One viewer's bounded buffer of live payloads (`None` = idle tick)."""

    def __init__(self, limit: int, on_drop: Callable[[int, bool], None] | None = None) -> None:
        self._items: deque[str | None] = deque()
        self._limit = limit
        self._on_drop = on_drop
        """Told (payloads dropped, whether this drop cut the viewer off) on every loss."""
        self._ready = asyncio.Event()
        self.start: str | None = None
        """The live stream's entry after which this viewer gets everything (None: unknown,
        Redis was unreachable when it joined)."""
        self.cut_off = asyncio.Event()
        """Set when this viewer overflowed its buffer; `next` then raises SlowConsumer."""

    def offer(self, item: str | None) -> None:
        """Queue one item without ever waiting; overflowing cuts this viewer off."""
        if self.cut_off.is_set():
            self._dropped(int(item is not None), cut=False)
            return
        if item is None and self._items and self._items[-1] is None:
            return  # an unread tick says all a second one would
        if len(self._items) >= self._limit:
            lost = sum(queued is not None for queued in self._items) + int(item is not None)
            self._items.clear()
            self.cut_off.set()
            self._dropped(lost, cut=True)
        else:
            self._items.append(item)
        self._ready.set()

    def _dropped(self, payloads: int, *, cut: bool) -> None:
        if self._on_drop is not None and (payloads or cut):
            self._on_drop(payloads, cut)

    async def next(self) -> str | None:
        """The next payload or tick, in order; SlowConsumer once cut off."""
        while not self._items:
            if self.cut_off.is_set():
                raise SlowConsumer
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()


@dataclass(eq=False)
class _Feed:
    task_id: str
    subscribers: set[Subscription] = field(default_factory=set)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    cursor: str | None = None
    reader: asyncio.Task[None] | None = None
    stopped: bool = False
    """Set with the reader's cancel: a cancel that a Redis call swallowed (app/kit/periodic.py)
    must not leave the reader polling a feed nobody holds."""


class LiveHub:
    """The process's readers of per-task live streams; one per task while anyone watches."""

    def __init__(
        self,
        redis: Redis,
        *,
        buffer: int = defaults.STREAM_CLIENT_BUFFER,
        tick_s: float = defaults.STREAM_KEEPALIVE_S,
    ) -> None:
        self._redis = redis
        self._buffer = buffer
        self._tick_s = tick_s
        self._feeds: dict[str, _Feed] = {}
        self._readers: set[asyncio.Task[None]] = set()
        """Every reader not yet ended, also those whose feed is gone (`_leave`)."""
        self._dropped_events = 0
        self._slow_viewers = 0

    @asynccontextmanager
    async def subscribe(self, task_id: str) -> AsyncIterator[Subscription]:
        """Receive what is published to the task's live stream from now on, until exit."""
        feed = self._feeds.get(task_id)
        if feed is None:
            feed = self._feeds[task_id] = _Feed(task_id)
            feed.reader = asyncio.create_task(self._run(feed), name=f"live-{task_id}")
            self._readers.add(feed.reader)
            feed.reader.add_done_callback(self._readers.discard)
        sub = Subscription(self._buffer, self._count_drop)
        if feed.ready.is_set():  # joined between two deliveries: it gets what comes after
            sub.start = feed.cursor
        feed.subscribers.add(sub)
        try:
            await feed.ready.wait()  # the starting position is noted: nothing is missed now
            yield sub
        finally:
            self._leave(feed, sub)

    def stats(self) -> dict[str, int]:
        """Readers running and viewers attached, for tests and metrics."""
        viewers = sum(len(feed.subscribers) for feed in self._feeds.values())
        return {"readers": len(self._feeds), "viewers": viewers}

    def losses(self) -> dict[str, int]:
        """Since start: viewers cut off for being slow, and the payloads they never got."""
        return {"slow_viewers": self._slow_viewers, "dropped_events": self._dropped_events}

    def _count_drop(self, payloads: int, cut: bool) -> None:
        self._dropped_events += payloads
        self._slow_viewers += int(cut)

    async def in_flight(self, task_id: str, sub: Subscription) -> list[str]:
        """The live-only payloads published since the newest durable event and before `sub`
        joined (`live.in_flight`), at most a viewer's buffer of them; [] when its start is
        unknown or Redis is unreachable."""
        if sub.start is None:
            return []
        try:
            return await live.in_flight(self._redis, task_id, sub.start, limit=self._buffer)
        except (RedisError, OSError) as exc:
            log.warning("live stream of %s unreadable: %s", task_id, exc)
            return []

    async def aclose(self) -> None:
        """Stop every reader (process shutdown), also those still ending after their last
        viewer left, before the caller closes Redis under them."""
        for feed in self._feeds.values():
            feed.stopped = True
        self._feeds.clear()
        await cancelling.stop(self._readers)

    def _leave(self, feed: _Feed, sub: Subscription) -> None:
        feed.subscribers.discard(sub)
        if feed.subscribers:
            return
        if self._feeds.get(feed.task_id) is feed:
            del self._feeds[feed.task_id]
        feed.stopped = True
        if feed.reader is not None:
            feed.reader.cancel()

    async def _run(self, feed: _Feed) -> None:
        """Read the task's stream and hand each entry to every subscriber, forever."""
        feed.cursor = await self._position(feed.task_id)
        for sub in feed.subscribers:
            sub.start = feed.cursor
        feed.ready.set()
        loop = asyncio.get_running_loop()
        ticked = loop.time()
        while not feed.stopped:
            entries = await self._poll(feed)
            for _, payload in entries:
                self._broadcast(feed, payload)
            if not entries or loop.time() - ticked >= self._tick_s:
                self._broadcast(feed, None)
                ticked = loop.time()

    async def _position(self, task_id: str) -> str | None:
        """Where to start; None when Redis is unreachable (ticks cover the gap via Postgres)."""
        try:
            return await live.position(self._redis, task_id)
        except (RedisError, OSError) as exc:
            log.warning("live stream of %s unreadable, will retry: %s", task_id, exc)
        except Exception:
            log.exception("live stream of %s: unexpected error", task_id)
        return None

    async def _poll(self, feed: _Feed) -> list[tuple[str, str]]:
        """The next entries, [] after an idle tick_s; Redis errors wait a tick and yield []."""
        try:
            if feed.cursor is None:
                feed.cursor = await live.position(self._redis, feed.task_id)
            block_ms = max(1, int(self._tick_s * 1000))
            entries = await live.read_after(
                self._redis, feed.task_id, feed.cursor, block_ms=block_ms
            )
        except (RedisError, OSError) as exc:
            log.warning("live stream of %s unreadable, will retry: %s", feed.task_id, exc)
        except Exception:  # a reader must never die silently: its viewers would hang
            log.exception("live stream of %s: unexpected error", feed.task_id)
        else:
            if entries:
                feed.cursor = entries[-1][0]
            return entries
        await asyncio.sleep(self._tick_s)
        return []

    @staticmethod
    def _broadcast(feed: _Feed, item: str | None) -> None:
        for sub in list(feed.subscribers):
            sub.offer(item)
