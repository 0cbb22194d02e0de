"""Who runs what, and who is alive: task leases and worker heartbeats in Redis.

A task's lease is one key, `holder` = "worker|message id", set with NX when a
worker takes the task and renewed (with its queue message's idle time) while
the task runs; when the worker dies the key expires and its message becomes
reclaimable. Postgres fencing (`services.attempts`) is what makes a stale
holder harmless; the lease is what keeps two live workers from both starting.
Imported by the worker, and by `services.admin` (heartbeats read, a lease dropped).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Collection, Mapping

from redis.asyncio import Redis

from app.bus import keys
from app.bus.presence import present

CONFIRM_FACTOR = 1.5
"""A missing heartbeat (or scoring lease) is confirmed this many heartbeat periods later:
a Redis that just lost its keys (a restart without persistence) must not declare live
workers dead."""

Look = Callable[[Collection[str]], Awaitable[set[str]]]
"""Which of these names hold their key now (`alive`, `held`, `bus.episodes.scoring`)."""


async def missing_twice(look: Look, names: Collection[str], heartbeat_s: float) -> set[str]:
    """The names `look` does not find, and still does not `CONFIRM_FACTOR` heartbeat periods
    later (only those missing the first time are looked at again)."""
    missing = set(names) - await look(names)
    if missing:
        await asyncio.sleep(heartbeat_s * CONFIRM_FACTOR)
        missing -= await look(missing)
    return missing


# KEYS: lease. ARGV: holder, lease ms. Returns "" when taken, else the current holder.
_ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return '' end
return redis.call('GET', KEYS[1]) or ''
"""

# KEYS: lease, stream. ARGV: holder, lease ms, group, consumer, message id.
# 1 while the lease is ours (a lease Redis lost is taken back), 0 once another holds it.
_RENEW = """
local current = redis.call('GET', KEYS[1])
if current and current ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
pcall(redis.call, 'XCLAIM', KEYS[2], ARGV[3], ARGV[4], 0, ARGV[5], 'JUSTID')
return 1
"""

# KEYS: lease, stream, stream to enqueue on, stream registry. ARGV: holder, group, message id,
# task id to enqueue again ("" for none).
# Drops the lease and acks the message unless another holder took the task over.
_RELEASE = """
local current = redis.call('GET', KEYS[1])
if current and current ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[4] ~= '' then
  redis.call('XADD', KEYS[3], '*', 'task_id', ARGV[4])
  redis.call('SADD', KEYS[4], KEYS[3])
end
pcall(redis.call, 'XACK', KEYS[2], ARGV[2], ARGV[3])
redis.call('XDEL', KEYS[2], ARGV[3])
return 1
"""


def holder_of(worker: str, message_id: str, stream: str = keys.TASK_STREAM) -> str:
    """`worker|id` for the default stream (as before images), `worker|stream|id` otherwise:
    ids are numbered per stream, so two streams can hold the same id."""
    if stream == keys.TASK_STREAM:
        return f"{worker}|{message_id}"
    return f"{worker}|{stream}|{message_id}"


def worker_of(holder: str) -> str:
    """The worker part of a holder value: always the first field (`worker|id` and
    `worker|stream|id` alike; a catalogue image's stream puts a field in the middle)."""
    return holder.partition("|")[0]


def message_of(holder: str) -> str:
    """The message id part of a holder value."""
    return holder.rpartition("|")[2]


def origin_of(holder: str) -> tuple[str, str]:
    """The (stream, message id) a holder value names."""
    rest, _, message_id = holder.rpartition("|")
    stream = rest.rpartition("|")[2]
    if not stream.startswith(keys.IMAGE_STREAM_PREFIX):
        stream = keys.TASK_STREAM  # `worker|id`: the default stream's
    return stream, message_id


async def acquire(redis: Redis, task_id: str, holder: str, lease_ms: int) -> str | None:
    """Take the task's lease: None when taken, else who holds it."""
    current = await redis.register_script(_ACQUIRE)(
        keys=[keys.task_lease(task_id)], args=[holder, lease_ms]
    )
    text = _text(current)
    return None if text == "" else text


async def renew(
    redis: Redis,
    task_id: str,
    holder: str,
    lease_ms: int,
    *,
    consumer: str,
    message_id: str,
    stream: str = keys.TASK_STREAM,
) -> bool:
    """Extend the lease and reset the message's idle time (on its image's `stream`); False
    once another holder has it."""
    kept = await redis.register_script(_RENEW)(
        keys=[keys.task_lease(task_id), stream],
        args=[holder, lease_ms, keys.WORKER_GROUP, consumer, message_id],
    )
    return bool(kept)


async def release(
    redis: Redis,
    task_id: str,
    holder: str,
    message_id: str,
    *,
    requeue: bool = False,
    stream: str = keys.TASK_STREAM,
    requeue_on: str | None = None,
) -> bool:
    """Drop the lease and ack the message (enqueueing the task again first when requeue, on
    `requeue_on`, by default the same `stream`: its image's)."""
    target = requeue_on or stream
    done = await redis.register_script(_RELEASE)(
        keys=[keys.task_lease(task_id), stream, target, keys.STREAM_REGISTRY],
        args=[holder, keys.WORKER_GROUP, message_id, task_id if requeue else ""],
    )
    return bool(done)


async def drop(redis: Redis, task_id: str) -> None:
    """Take the task's lease from whoever holds it (an operator's requeue)."""
    await redis.delete(keys.task_lease(task_id))


async def held(redis: Redis, task_ids: Collection[str]) -> set[str]:
    """The tasks among task_ids whose lease someone holds now."""
    return await present(redis, task_ids, keys.task_lease)


async def beat(redis: Redis, worker: str, ttl_ms: int, info: Mapping[str, object]) -> None:
    """Say the worker is alive for the next ttl_ms."""
    await redis.set(keys.worker_heartbeat(worker), json.dumps(dict(info)), px=ttl_ms)


async def alive(redis: Redis, workers: Collection[str]) -> set[str]:
    """The workers among `workers` whose heartbeat has not expired."""
    return await present(redis, workers, keys.worker_heartbeat)


async def worker_names(redis: Redis) -> list[str]:
    """The workers whose heartbeat is there now, each once (a `SCAN`: it may return a key
    twice); read their heartbeats after it in one round trip, as one may expire meanwhile."""
    prefix = keys.worker_heartbeat("")
    found = [_text(key) async for key in redis.scan_iter(match=f"{prefix}*", count=500)]
    return [name for name in dict.fromkeys(key[len(prefix) :] for key in found) if name]


async def live_images(redis: Redis) -> set[str]:
    """The catalogue images some live worker's heartbeat lists (its daemon has them)."""
    names = await worker_names(redis)
    if not names:
        return set()
    found: set[str] = set()
    for value in await redis.mget([keys.worker_heartbeat(name) for name in names]):
        if value is not None:  # expired since the SCAN
            found.update(str(name) for name in json.loads(value).get("images", []))
    return found


async def forget(redis: Redis, worker: str) -> None:
    """A clean exit: the worker is gone now, not after its heartbeat expires."""
    await redis.delete(keys.worker_heartbeat(worker))


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)
