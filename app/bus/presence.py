"""Which of several Redis keys exist, in one round trip: leases, heartbeats and cancel flags
all ask this question of many names at once (the worker's heartbeat, the reaper, reconciliation).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from redis.asyncio import Redis

from app.bus import keys


async def present(redis: Redis, names: Collection[str], key_of: Callable[[str], str]) -> set[str]:
    """The names among `names` whose key `key_of(name)` is set now."""
    if not names:
        return set()
    ordered = list(names)
    values = await redis.mget([key_of(name) for name in ordered])
    return {name for name, value in zip(ordered, values, strict=True) if value is not None}


async def any_worker(redis: Redis) -> bool:
    """Whether any worker's heartbeat is alive now (a scan that stops at the first one)."""
    async for _ in redis.scan_iter(match=keys.worker_heartbeat("*"), count=1000):
        return True
    return False
