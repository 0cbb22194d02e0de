"""Which of several Redis keys exist, in one round trip: leases, heartbeats and cancel flags
all ask this question of many names at once (the worker's heartbeat, the reaper, reconciliation).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from redis.asyncio import Redis


async def present(redis: Redis, names: Collection[str], key_of: Callable[[str], str]) -> set[str]:
    """The names among `names` whose key `key_of(name)` is set now."""
    if not names:
        return set()
    ordered = list(names)
    values = await redis.mget([key_of(name) for name in ordered])
    return {name for name, value in zip(ordered, values, strict=True) if value is not None}
