"""Commands a Redis server has run, counted from its own `INFO commandstats`: what a path
costs Redis, so that a change adding commands to a hot path shows in a test (counts, not
times)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis


async def commands_run(redis: Redis) -> int:
    """Every command the server has run so far, this `INFO` included: take the difference of
    two, less one."""
    stats: dict[str, Any] = await redis.info("commandstats")
    return sum(int(entry["calls"]) for entry in stats.values())
