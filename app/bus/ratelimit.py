"""Per-tenant request rate: a token bucket in Redis, one small Lua script, atomic.

Imported by the API (deps). The bucket holds up to `burst` tokens and refills at
`rate` per second (Redis's own clock, so many API processes share one budget);
each request takes one. Keys expire once a bucket would be full again.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from app.bus import keys

_TAKE = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or burst
local ts = tonumber(state[2]) or t
tokens = math.min(burst, tokens + math.max(0, t - ts) * rate)
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = (1 - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(t))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return tostring(wait)
"""


async def take(redis: Redis, tenant: str, rate: float, burst: int) -> float:
    """Take one token: 0.0 when allowed, else the seconds until one is available."""
    script: Any = redis.register_script(_TAKE)
    wait = await script(keys=[keys.rate_bucket(tenant)], args=[repr(float(rate)), str(burst)])
    return float(wait.decode() if isinstance(wait, bytes) else wait)
