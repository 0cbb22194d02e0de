"""The process's long-lived clients: one way to open and close them, for every entry point.

The API lifespan, the worker, the command line and the tests all open Postgres
and Redis here, so every process configures them the same way (and a test's
process is a production one).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.db.engine import POOL_SIZE, Sessions, create_engine, create_sessions


@dataclass(frozen=True)
class Resources:
    settings: Settings
    engine: AsyncEngine
    sessions: Sessions
    redis: Redis


@asynccontextmanager
async def open_resources(settings: Settings) -> AsyncIterator[Resources]:
    """Engine, sessions and Redis for the life of the caller; closed on the way out.

    Nothing connects yet (both clients connect on first use), so opening never
    fails on an unreachable server: the first call does, where it can be reported.
    """
    # A worker's slots each write their steps in their own transactions, all at once.
    pool_size = settings.database_pool_size or max(POOL_SIZE, settings.worker_concurrency + 4)
    engine = create_engine(
        settings.database_url,
        pool_size=pool_size,
        ping_bypass_s=settings.database_ping_bypass_s,
    )
    redis = open_redis(settings)
    try:
        yield Resources(settings, engine, create_sessions(engine), redis)
    finally:
        await redis.aclose()
        await engine.dispose()


def open_redis(settings: Settings) -> Redis:
    """The Redis client with its timeouts set here, never left to the library's defaults.

    Those defaults changed under us (no timeout in redis-py 5, 5 s in 8.x; no connection
    cap in 5, 100 in 8.x), and a socket timeout shorter than a blocking read (`Settings`
    keeps them apart) fails that read whenever Redis has nothing to say.
    """
    return Redis.from_url(
        settings.redis_url,
        socket_timeout=settings.redis_socket_timeout_s,
        socket_connect_timeout=settings.redis_connect_timeout_s,
        max_connections=settings.redis_max_connections,
    )
