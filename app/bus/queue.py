"""The task queue: one Redis stream, one consumer group, one message per attempt to run.

Postgres holds the truth; a message only says "look at task X". Imported by
services (enqueue) and the worker (claim, ack).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from app.bus import keys


@dataclass(frozen=True)
class Claim:
    message_id: str
    task_id: str


async def ensure_group(redis: Redis) -> None:
    """Create the stream and its consumer group if they do not exist yet."""
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
        if "NOGROUP" not in str(exc):
            raise
        await ensure_group(redis)  # Redis lost its data; Postgres reconciliation re-enqueues
        return None
    if not reply:
        return None
    # redis-py types replies loosely; the shape is fixed by XREADGROUP: [[stream, [(id, fields)]]]
    message_id, fields = reply[0][1][0]
    return Claim(message_id=_text(message_id), task_id=_text(fields[b"task_id"]))


async def ack(redis: Redis, claim: Claim) -> None:
    await redis.xack(keys.TASK_STREAM, keys.WORKER_GROUP, claim.message_id)
    await redis.xdel(keys.TASK_STREAM, claim.message_id)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
