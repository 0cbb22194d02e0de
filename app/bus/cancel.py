"""Cancel flags: the API raises one for a running task; the worker running it polls them.

Only the fast path: the request is durable in Postgres (`tasks.cancel_requested_at`),
which a worker also reads when it starts an attempt and on every lease renewal.
Imported by services (raise) and the worker (poll, clear).
"""

from __future__ import annotations

from collections.abc import Collection

from redis.asyncio import Redis

from app.bus import keys
from app.bus.presence import present

FLAG_TTL_S = 24 * 3600


async def raise_flag(redis: Redis, task_id: str) -> None:
    await redis.set(keys.cancel_flag(task_id), "1", ex=FLAG_TTL_S)


async def flagged(redis: Redis, task_ids: Collection[str]) -> set[str]:
    """The tasks among task_ids that someone asked to cancel."""
    return await present(redis, task_ids, keys.cancel_flag)


async def clear(redis: Redis, task_id: str) -> None:
    await redis.delete(keys.cancel_flag(task_id))
