"""Cancel flags: the API raises one for a running task; the worker running it polls them.

Only the fast path: the request is durable in Postgres (`tasks.cancel_requested_at`),
which a worker also reads when it starts an attempt and on every lease renewal.
Imported by services (raise) and the worker (poll, clear).
"""

from __future__ import annotations

from collections.abc import Collection

from redis.asyncio import Redis

from app.bus import keys

FLAG_TTL_S = 24 * 3600


async def raise_flag(redis: Redis, task_id: str) -> None:
    await redis.set(keys.cancel_flag(task_id), "1", ex=FLAG_TTL_S)


async def flagged(redis: Redis, task_ids: Collection[str]) -> set[str]:
    """The tasks among task_ids that someone asked to cancel."""
    if not task_ids:
        return set()
    ordered = list(task_ids)
    values = await redis.mget([keys.cancel_flag(task_id) for task_id in ordered])
    return {task_id for task_id, value in zip(ordered, values, strict=True) if value is not None}


async def clear(redis: Redis, task_id: str) -> None:
    await redis.delete(keys.cancel_flag(task_id))
