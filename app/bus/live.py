"""Per-task live event streams: the worker publishes, API followers read.

A Redis stream (not pub/sub) so that a follower can start reading from the
position it noted *before* replaying Postgres: nothing published in between is
missed (invariant 3). Entries are capped and the stream expires after the task.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import Redis

from app.bus import keys

MAX_ENTRIES = 10_000
EXPIRE_AFTER_FINISH_S = 3600


async def publish(redis: Redis, task_id: str, payload: str) -> None:
    """Append one serialised event to the task's live stream."""
    await redis.xadd(
        keys.live_events(task_id), {"e": payload}, maxlen=MAX_ENTRIES, approximate=True
    )


async def expire(redis: Redis, task_id: str) -> None:
    await redis.expire(keys.live_events(task_id), EXPIRE_AFTER_FINISH_S)


async def position(redis: Redis, task_id: str) -> str:
    """The id of the newest entry now ("0-0" if none): follow from here."""
    newest = await redis.xrevrange(keys.live_events(task_id), count=1)
    if not newest:
        return "0-0"
    entry_id = newest[0][0]
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


async def follow(
    redis: Redis, task_id: str, start: str, *, block_ms: int = 5_000
) -> AsyncIterator[str | None]:
    """Yield payloads published after `start`; yields None after each idle wait (keepalive)."""
    last = start
    stream = keys.live_events(task_id)
    while True:
        reply: Any = await redis.xread({stream: last}, count=100, block=block_ms)
        if not reply:
            yield None
            continue
        for entry_id, fields in reply[0][1]:
            last = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
            payload = fields[b"e"]
            yield payload.decode() if isinstance(payload, bytes) else str(payload)
