"""What routes may ask for: the lifespan's `Resources` and the caller's tenant.

`open_resources` builds the long-lived clients once per process; dependencies
only read them from the connection's lifespan state.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from starlette.requests import HTTPConnection

from app.bus import queue
from app.config import Settings
from app.db.engine import create_engine, create_sessions
from app.errors import Unauthorized

log = logging.getLogger(__name__)

DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class Resources:
    settings: Settings
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    redis: Redis


@asynccontextmanager
async def open_resources(settings: Settings) -> AsyncIterator[Resources]:
    """Engine, sessions and Redis for the life of the process; closed on the way out."""
    engine = create_engine(settings.database_url)
    redis = Redis.from_url(settings.redis_url)
    try:
        await _ensure_queue(redis)
        yield Resources(settings, engine, create_sessions(engine), redis)
    finally:
        await redis.aclose()
        await engine.dispose()


async def _ensure_queue(redis: Redis) -> None:
    # A Redis outage must not stop the API from starting: /readyz reports it,
    # and the worker creates the group too.
    try:
        await queue.ensure_group(redis)
    except (RedisError, OSError) as exc:
        log.warning("could not create the task queue's consumer group: %s", exc)


async def get_resources(conn: HTTPConnection) -> Resources:
    res: Resources = conn.state.res
    return res


Res = Annotated[Resources, Depends(get_resources)]


def presented_key(conn: HTTPConnection) -> str | None:
    """`Authorization: Bearer <key>`, or `?token=<key>` on a WebSocket (browsers set no headers)."""
    scheme, _, key = conn.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and key.strip():
        return key.strip()
    if conn.scope["type"] == "websocket":
        return conn.query_params.get("token") or None
    return None


async def current_tenant(conn: HTTPConnection, res: Res) -> str:
    """The caller's tenant; everyone is `default` while auth is disabled."""
    if res.settings.auth == "disabled":
        return DEFAULT_TENANT
    if presented_key(conn) is None:
        raise Unauthorized("missing API key: send `Authorization: Bearer <key>`")
    raise Unauthorized("API keys arrive with the security issue")


Tenant = Annotated[str, Depends(current_tenant)]
