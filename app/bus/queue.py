"""The task queue: one Redis stream per catalogue image, one consumer group each, one message
per request to run a task.

Postgres holds the truth; a message only says "look at task X". A worker that
reads a message owns it (the group's pending list) until it acks it; the
task's lease (`app.bus.leases`) says whether that owner is still alive, and a
message idle for longer than a lease is reclaimed with XAUTOCLAIM by another
worker. Imported by services (enqueue) and the worker (claim, reclaim, ack).

A worker reads only the streams of the images its Docker daemon has
(`app.worker.images`), so a task never lands on a host that lacks its image: it waits
on its stream until a worker that has the image reads it. Across the streams a worker
reads, `claim` takes the oldest waiting message first (one Lua script picks and reads
it; with none waiting, it blocks in the group, where a new message wakes one worker), so
the order is first come, first served as with a single stream (across streams, to the
millisecond: message ids are numbered per stream within one). The multi-key scripts
need Redis standalone or Sentinel, not Cluster (docs/images.md).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from app.bus import keys

log = logging.getLogger(__name__)
DEAD_LETTER_MAXLEN = 10_000
SCAN_PAGE = 1_000
_RECLAIM_TURNS = itertools.count()
"""Which stream `reclaim` starts from next (rotated per call)."""


# KEYS: the streams to read. ARGV: group, consumer.
# The oldest message no consumer of the group has read yet, across the streams, read for the
# consumer: {stream, id, field, value, ...}; none: {"", last delivered id of each stream}.
# An error starting with NOGROUP when a stream or its group is missing.
_CLAIM_OLDEST = """
local best, best_ms, best_seq = nil, 0, 0
local last = {}
for i, key in ipairs(KEYS) do
  local groups = redis.pcall('XINFO', 'GROUPS', key)
  if type(groups) ~= 'table' or groups.err then return redis.error_reply('NOGROUP ' .. key) end
  local delivered = nil
  for _, g in ipairs(groups) do
    local name, id = nil, nil
    for j = 1, #g, 2 do
      if g[j] == 'name' then name = g[j + 1] end
      if g[j] == 'last-delivered-id' then id = g[j + 1] end
    end
    if name == ARGV[1] then delivered = id end
  end
  if delivered == nil then return redis.error_reply('NOGROUP ' .. key) end
  last[i] = delivered
  local head = redis.call('XRANGE', key, '(' .. delivered, '+', 'COUNT', 1)
  if #head > 0 then
    local id = head[1][1]
    local dash = string.find(id, '-', 1, true)
    local ms, seq = tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
    if best == nil or ms < best_ms or (ms == best_ms and seq < best_seq) then
      best, best_ms, best_seq = key, ms, seq
    end
  end
end
if best == nil then
  table.insert(last, 1, '')
  return last
end
local got = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1, 'STREAMS', best, '>')
local entry = got[1][2][1]
local reply = {best, entry[1]}
for _, item in ipairs(entry[2]) do table.insert(reply, item) end
return reply
"""


@dataclass(frozen=True)
class Claim:
    message_id: str
    task_id: str
    stream: str = keys.TASK_STREAM
    """The stream it was read from (its image's): renewals, acks and requeues go there."""


def streams_of(images: Iterable[str]) -> list[str]:
    """The streams of these catalogue images, in a stable order."""
    return sorted({keys.task_stream(image) for image in images})


async def ensure_group(redis: Redis, streams: Iterable[str] = (keys.TASK_STREAM,)) -> None:
    """Create each stream and its consumer group if they do not exist yet.

    The group starts at 0, not $: entries added before it existed (e.g. by a
    reconciliation right after Redis lost its data, or an API that enqueued a
    task of an image no worker had yet) are still delivered.
    """
    streams = list(streams)
    if streams:
        await redis.sadd(keys.STREAM_REGISTRY, *streams)
    for stream in streams:
        try:
            await redis.xgroup_create(stream, keys.WORKER_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise


async def enqueue(redis: Redis, task_id: str, image: str = "default") -> str:
    """Put the task on its image's stream (`image`: its `SandboxSpec.image_name`)."""
    stream = keys.task_stream(image)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.xadd(stream, {"task_id": task_id})
        pipe.sadd(keys.STREAM_REGISTRY, stream)  # `all_streams` reads this, not a SCAN
        message_id, _ = await pipe.execute()
    return _text(message_id)


async def claim(
    redis: Redis, consumer: str, *, block_ms: int, streams: Sequence[str] = (keys.TASK_STREAM,)
) -> Claim | None:
    """Take the oldest new message of these streams for this consumer, waiting up to block_ms.

    The script picks the oldest waiting message; when none waits, the worker blocks in
    the group itself (XREADGROUP): Redis hands a new message to one blocked consumer,
    so a message wakes one idle worker, not all of them, and an idle wait runs the
    script once.
    """
    reply = await _claim_oldest(redis, consumer, streams)
    if isinstance(reply, Claim) or reply is None:
        return reply
    try:
        got: Any = await redis.xreadgroup(
            keys.WORKER_GROUP, consumer, dict.fromkeys(streams, ">"), count=1, block=block_ms
        )
    except ResponseError as exc:
        await _recreate_group(exc)
        await ensure_group(redis, streams)
        return None
    return await _first_of(redis, got or [])


async def _first_of(redis: Redis, got: Any) -> Claim | None:
    """The oldest message of an XREADGROUP reply; the others are put back on their streams.

    COUNT is per stream: messages that reached two streams between the script and the
    read are both delivered here. Each one not taken goes back as a fresh message (XADD,
    then ack and delete, in one transaction): never lost, never left pending on a
    consumer that holds no lease on it (that would wait a whole lease to be reclaimed).
    """
    read = [(_text(stream), _text(entries[0][0]), entries[0][1]) for stream, entries in got]
    read.sort(key=lambda item: _id_key(item[1]))
    for stream, message_id, fields in read[1:]:
        async with redis.pipeline(transaction=True) as pipe:
            pipe.xadd(stream, fields)
            pipe.xack(stream, keys.WORKER_GROUP, message_id)
            pipe.xdel(stream, message_id)
            await pipe.execute()
    if not read:
        return None
    stream, message_id, fields = read[0]
    return await _valid(
        redis, message_id, {_bytes(k): _bytes(v) for k, v in fields.items()}, stream
    )


def _id_key(message_id: str) -> tuple[int, int]:
    ms, _, seq = message_id.partition("-")
    return int(ms), int(seq or 0)


async def _claim_oldest(
    redis: Redis, consumer: str, streams: Sequence[str]
) -> Claim | list[str] | None:
    """A claim; else the last delivered id of each stream; None when a group was recreated."""
    if not streams:
        return None
    try:
        reply: Any = await redis.register_script(_CLAIM_OLDEST)(
            keys=list(streams), args=[keys.WORKER_GROUP, consumer]
        )
    except ResponseError as exc:
        await _recreate_group(exc)
        await ensure_group(redis, streams)
        return None
    stream = _text(reply[0])
    if not stream:
        return [_text(item) for item in reply[1:]]
    flat = reply[2:]
    fields = {_bytes(flat[i]): _bytes(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}
    return await _valid(redis, _text(reply[1]), fields, stream)


async def reclaim(
    redis: Redis, consumer: str, *, min_idle_ms: int, streams: Sequence[str] = (keys.TASK_STREAM,)
) -> Claim | None:
    """Take over one message whose owner has not renewed it for min_idle_ms (a dead worker's).

    One read-only round trip (a pipelined XPENDING per stream) finds which streams have
    such a message, starting from a different stream each call so that workers do not
    all favour the first; only then is one XAUTOCLAIM sent, so the other streams'
    messages are left for other workers (claiming them here would restart their idle time).
    """
    if not streams:
        return None
    start = next(_RECLAIM_TURNS) % len(streams)
    order = [*streams[start:], *streams[:start]]
    async with redis.pipeline(transaction=False) as pipe:
        for stream in order:
            pipe.xpending_range(stream, keys.WORKER_GROUP, "-", "+", 1, idle=min_idle_ms)
        pending: list[Any] = await pipe.execute(raise_on_error=False)
    for stream, found in zip(order, pending, strict=True):
        if isinstance(found, ResponseError):
            await _recreate_group(found)
            await ensure_group(redis, streams)
            return None
        if not found:
            continue
        reply: Any = await redis.xautoclaim(
            stream, keys.WORKER_GROUP, consumer, min_idle_ms, "0-0", count=1
        )
        # [next_start, [(id, fields), ...], [deleted ids]]; entries deleted meanwhile have no fields
        for message_id, fields in reply[1]:
            if fields:
                return await _valid(redis, _text(message_id), fields, stream)
    return None


async def ack(redis: Redis, message_id: str, stream: str = keys.TASK_STREAM) -> None:
    """Done with a message: drop it from the pending list and from the stream."""
    await redis.xack(stream, keys.WORKER_GROUP, message_id)
    await redis.xdel(stream, message_id)


async def all_streams(redis: Redis, known: Iterable[str] = ()) -> list[str]:
    """Every task stream there is: `default`'s, `known` (the catalogue's) and each one ever
    written (the registry set `enqueue`, `ensure_group` and requeues add to; no SCAN)."""
    found = {keys.TASK_STREAM, *known}
    found.update(_text(raw) for raw in await redis.smembers(keys.STREAM_REGISTRY))
    return sorted(found)


async def depth(redis: Redis, known: Iterable[str] = ()) -> int:
    """Entries in every task stream (waiting or being worked on)."""
    streams = await all_streams(redis, known)
    async with redis.pipeline(transaction=False) as pipe:
        for stream in streams:
            pipe.xlen(stream)
        lengths = await pipe.execute()
    return sum(int(length) for length in lengths)


async def queued_task_ids(redis: Redis, known: Iterable[str] = ()) -> set[str]:
    """Task ids of every message still in a stream (not yet acked: waiting or running)."""
    found: set[str] = set()
    for stream in await all_streams(redis, known):
        found.update((await messages_of(redis, stream)).values())
    return found


async def messages_of(redis: Redis, stream: str) -> dict[str, str]:
    """Every message still in one stream: message id -> task id (paged XRANGE)."""
    found: dict[str, str] = {}
    start = "-"
    while True:
        page: Any = await redis.xrange(stream, min=start, count=SCAN_PAGE)
        for message_id, fields in page:
            if task_id := fields.get(b"task_id"):
                found[_text(message_id)] = _text(task_id)
        if len(page) < SCAN_PAGE:
            return found
        start = "(" + _text(page[-1][0])


async def drop(redis: Redis, stream: str, message_ids: Sequence[str]) -> None:
    """Ack and delete these messages of one stream (their tasks are over)."""
    if message_ids:
        await redis.xack(stream, keys.WORKER_GROUP, *message_ids)
        await redis.xdel(stream, *message_ids)


@dataclass(frozen=True)
class Backlog:
    """What waits on one stream: messages no worker has read yet, the oldest one's time."""

    stream: str
    waiting: int
    oldest_ms: int | None


async def backlogs(redis: Redis, streams: Sequence[str]) -> list[Backlog]:
    """Each stream's backlog, in two pipelined round trips whatever the number of streams.

    Acked messages are deleted (`ack`), so a stream's length less its pending entries is
    what no worker has read; the oldest of those comes right after the group's last
    delivered id.
    """
    async with redis.pipeline(transaction=True) as pipe:
        for stream in streams:
            pipe.xlen(stream)
            pipe.xinfo_groups(stream)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    counts: list[tuple[str, int, str]] = []
    for i, stream in enumerate(streams):
        length, groups = replies[2 * i], replies[2 * i + 1]
        group = _group_info(groups)
        if isinstance(length, ResponseError):
            length = 0
        if group is None:  # no group yet (e.g. an XADD before any worker had the image)
            counts.append((stream, int(length), ""))  # the group will start at 0: all wait
            continue
        pending = int(group.get("pending", 0))
        counts.append((stream, max(int(length) - pending, 0), _text(group["last-delivered-id"])))
    async with redis.pipeline(transaction=False) as pipe:
        for stream, _waiting, last in counts:
            pipe.xrange(stream, min=f"({last}" if last else "-", count=1)
        heads: list[Any] = await pipe.execute()
    return [
        Backlog(stream, waiting, int(_text(head[0][0]).split("-")[0]) if head else None)
        for (stream, waiting, _last), head in zip(counts, heads, strict=True)
    ]


def _group_info(groups: Any) -> dict[str, Any] | None:
    """The worker group's XINFO GROUPS entry (keys as text), None if it is missing."""
    if isinstance(groups, ResponseError):
        return None
    for group in groups:
        info = {_text(key): value for key, value in group.items()}
        if _text(info.get("name", b"")) == keys.WORKER_GROUP:
            return info
    return None


async def _valid(
    redis: Redis, message_id: str, fields: dict[bytes, bytes], stream: str
) -> Claim | None:
    """The claim, or None after moving a malformed message to the dead letters."""
    task_id = fields.get(b"task_id")
    if task_id:
        return Claim(message_id=message_id, task_id=_text(task_id), stream=stream)
    log.warning("dead-lettering malformed queue message %s", message_id)
    await redis.xadd(
        keys.DEAD_LETTERS,
        {"message_id": message_id, "reason": "no task_id"},
        maxlen=DEAD_LETTER_MAXLEN,
        approximate=True,
    )
    await ack(redis, message_id, stream)
    return None


async def _recreate_group(exc: ResponseError) -> None:
    """NOGROUP means Redis lost its data: recreate (reconciliation re-enqueues); else re-raise."""
    if "NOGROUP" not in str(exc):
        raise exc
    log.warning("task queue group missing (Redis lost its data?); recreating it")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()
