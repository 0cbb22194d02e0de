"""The task queue: one Redis stream, one consumer group, one message per request to run a task.

Postgres holds the truth; a message only says "look at task X". A worker that
reads a message owns it (the group's pending list) until it acks it; the
task's lease (`app.bus.leases`) says whether that owner is still alive, and a
message idle for longer than a lease is reclaimed with XAUTOCLAIM by another
worker. Imported by services (enqueue) and the worker (claim, reclaim, ack).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from app.bus import keys

log = logging.getLogger(__name__)
DEAD_LETTER_MAXLEN = 10_000
SCAN_PAGE = 1_000


@dataclass(frozen=True)
class Claim:
    message_id: str
    task_id: str


async def ensure_group(redis: Redis) -> None:
    """Create the stream and its consumer group if they do not exist yet.

    The group starts at 0, not $: entries added before it existed (e.g. by a
    reconciliation right after Redis lost its data) are still delivered.
    """
    try:
        await redis.xgroup_create(keys.TASK_STREAM, keys.WORKER_GROUP, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


async def enqueue(redis: Redis, task_id: str) -> str:
    message_id = await redis.xadd(keys.TASK_STREAM, {"task_id": task_id})
    return _text(message_id)


async def claim(redis: Redis, consumer: str, *, block_ms: int) -> Claim | None:
    """Take the next new message for this consumer, waiting up to block_ms."""
    try:
        reply: Any = await redis.xreadgroup(
            keys.WORKER_GROUP, consumer, {keys.TASK_STREAM: ">"}, count=1, block=block_ms
        )
    except ResponseError as exc:
        await _recreate_group(exc)
        await ensure_group(redis)
        return None
    if not reply:
        return None
    # redis-py types replies loosely; the shape is fixed by XREADGROUP: [[stream, [(id, fields)]]]
    message_id, fields = reply[0][1][0]
    return await _valid(redis, _text(message_id), fields)


async def reclaim(redis: Redis, consumer: str, *, min_idle_ms: int) -> Claim | None:
    """Take over one message whose owner has not renewed it for min_idle_ms (a dead worker's)."""
    try:
        reply: Any = await redis.xautoclaim(
            keys.TASK_STREAM, keys.WORKER_GROUP, consumer, min_idle_ms, "0-0", count=1
        )
    except ResponseError as exc:
        await _recreate_group(exc)
        await ensure_group(redis)
        return None
    # [next_start, [(id, fields), ...], [deleted ids]]; entries deleted meanwhile have no fields
    for message_id, fields in reply[1]:
        if fields:
            return await _valid(redis, _text(message_id), fields)
    return None


async def ack(redis: Redis, message_id: str) -> None:
    """Done with a message: drop it from the pending list and from the stream."""
    await redis.xack(keys.TASK_STREAM, keys.WORKER_GROUP, message_id)
    await redis.xdel(keys.TASK_STREAM, message_id)


async def queued_task_ids(redis: Redis) -> set[str]:
    """Task ids of every message still in the stream (not yet acked: waiting or running)."""
    found: set[str] = set()
    start = "-"
    while True:
        page: Any = await redis.xrange(keys.TASK_STREAM, min=start, count=SCAN_PAGE)
        for _message_id, fields in page:
            if task_id := fields.get(b"task_id"):
                found.add(_text(task_id))
        if len(page) < SCAN_PAGE:
            return found
        start = "(" + _text(page[-1][0])


async def _valid(redis: Redis, message_id: str, fields: dict[bytes, bytes]) -> Claim | None:
    """The claim, or None after moving a malformed message to the dead letters."""
    task_id = fields.get(b"task_id")
    if task_id:
        return Claim(message_id=message_id, task_id=_text(task_id))
    log.warning("dead-lettering malformed queue message %s", message_id)
    await redis.xadd(
        keys.DEAD_LETTERS,
        {"message_id": message_id, "reason": "no task_id"},
        maxlen=DEAD_LETTER_MAXLEN,
        approximate=True,
    )
    await ack(redis, message_id)
    return None


async def _recreate_group(exc: ResponseError) -> None:
    """NOGROUP means Redis lost its data: recreate (reconciliation re-enqueues); else re-raise."""
    if "NOGROUP" not in str(exc):
        raise exc
    log.warning("task queue group missing (Redis lost its data?); recreating it")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
