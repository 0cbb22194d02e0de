"""Per-tenant cap on open event streams (WebSocket and SSE), shared by every API process.

Imported by the API (stream). One sorted set per tenant: a member per open
stream, scored by the Redis-clock time at which it expires. Taking a slot prunes
expired members, counts, and adds, in one Lua script (atomic, so two processes
cannot both take the last slot). The holder refreshes its expiry while the stream
is open and removes it on close; a process that dies without closing frees its
slots when they expire, so no slot is lost for longer than `ttl_s`. The key's own
expiry is only ever pushed later, so a holder with a shorter `ttl_s` cannot drop
the slots of others.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from app.bus import keys

_TAKE = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
local cap = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t)
if redis.call('ZCARD', KEYS[1]) >= cap then
  return 0
end
redis.call('ZADD', KEYS[1], t + ttl, ARGV[1])
local keep = math.ceil(ttl * 1000) + 1000
if redis.call('PTTL', KEYS[1]) < keep then redis.call('PEXPIRE', KEYS[1], keep) end
return 1
"""

_REFRESH = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], t + ttl, ARGV[1])
local keep = math.ceil(ttl * 1000) + 1000
if redis.call('PTTL', KEYS[1]) < keep then redis.call('PEXPIRE', KEYS[1], keep) end
return 1
"""


async def take(redis: Redis, tenant: str, stream_id: str, cap: int, ttl_s: float) -> bool:
    """Add `stream_id` to the tenant's open streams unless `cap` are already open."""
    script: Any = redis.register_script(_TAKE)
    taken = await script(
        keys=[keys.stream_slots(tenant)], args=[stream_id, str(cap), repr(float(ttl_s))]
    )
    return int(taken) == 1


async def refresh(redis: Redis, tenant: str, stream_id: str, ttl_s: float) -> None:
    """Push the slot's expiry `ttl_s` ahead (re-adding it if a Redis outage let it expire:
    the stream is still open, so it still counts)."""
    script: Any = redis.register_script(_REFRESH)
    await script(keys=[keys.stream_slots(tenant)], args=[stream_id, repr(float(ttl_s))])


async def give_back(redis: Redis, tenant: str, stream_id: str) -> None:
    await redis.zrem(keys.stream_slots(tenant), stream_id)


async def open_count(redis: Redis, tenant: str) -> int:
    """Streams the tenant holds now (expired ones included until the next `take` prunes them)."""
    return int(await redis.zcard(keys.stream_slots(tenant)))
