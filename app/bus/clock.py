"""Redis's clock: the one a deadline written by one host and read by another is set on.

A file request's or an open request's deadline is written by the API and read by a
worker; their hosts' clocks may disagree by seconds or minutes, Redis's is one clock for
both. One `TIME` round trip per reading.
"""

from __future__ import annotations

from redis.asyncio import Redis


async def redis_now(redis: Redis) -> float:
    """Seconds since the epoch, by the Redis server's clock."""
    seconds, micros = await redis.time()
    return float(seconds) + micros / 1_000_000
