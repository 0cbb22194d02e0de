"""Per-task live event streams: the worker publishes, API processes read.

A Redis stream (not pub/sub) so that a reader can start from a position it
noted *before* replaying Postgres: nothing published in between is missed
(invariant 3). Entries are capped and the stream expires an hour after the
task's last event. Readers go through `app.bus.fanout`, one per task and process.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis

from app.bus import keys

MAX_ENTRIES = 10_000
EXPIRE_AFTER_FINISH_S = 3600
READ_BATCH = 500


async def publish(
    redis: Redis, task_id: str, payloads: Sequence[str], *, expire: bool = False
) -> None:
    """Append serialised events in order, in one round trip; `expire`: the task is done."""
    pipe = redis.pipeline(transaction=False)
    for payload in payloads:
        pipe.xadd(keys.live_events(task_id), {"e": payload}, maxlen=MAX_ENTRIES, approximate=True)
    if expire:
        pipe.expire(keys.live_events(task_id), EXPIRE_AFTER_FINISH_S)
    await pipe.execute()


async def position(redis: Redis, task_id: str) -> str:
    """The id of the newest entry now ("0-0" if none): read after this."""
    newest = await redis.xrevrange(keys.live_events(task_id), count=1)
    if not newest:
        return "0-0"
    return _text(newest[0][0])


async def read_after(
    redis: Redis, task_id: str, cursor: str, *, block_ms: int
) -> list[tuple[str, str]]:
    """(entry id, payload) of entries after `cursor`, waiting up to `block_ms` for the first."""
    reply: Any = await redis.xread(
        {keys.live_events(task_id): cursor}, count=READ_BATCH, block=block_ms
    )
    if not reply:
        return []
    return [(_text(entry_id), _text(fields[b"e"])) for entry_id, fields in reply[0][1]]


async def in_flight(redis: Redis, task_id: str, upto: str, *, limit: int) -> list[str]:
    """The live-only payloads (no `seq`) published since the newest durable event, up to
    entry `upto` (at most `limit` entries back), oldest first: what a viewer joining in
    the middle of a step has missed of it (the command that runs, its output so far)."""
    entries: Any = await redis.xrevrange(keys.live_events(task_id), max=upto, count=limit)
    found: list[str] = []
    for _, fields in entries:
        payload = _text(fields[b"e"])
        if json.loads(payload).get("seq") is not None:
            break  # the newest durable event: the viewer's replay from Postgres has it
        found.append(payload)
    found.reverse()
    return found


def _text(value: bytes | str | None) -> str:
    if value is None:
        raise ValueError("a live stream entry without an id or payload")
    return value.decode() if isinstance(value, bytes) else value
