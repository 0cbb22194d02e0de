"""What routes may ask for: the lifespan's `Resources` and the caller's tenant.

The lifespan opens the process's `Resources` (`app.resources`) once; dependencies
only read them from the connection's lifespan state.
"""

from __future__ import annotations

import base64
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends
from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.requests import HTTPConnection

from app.bus import queue, ratelimit
from app.config import Settings
from app.errors import InvalidInput, TooManyRequests, Unauthorized
from app.resources import Resources, open_resources
from app.services import keys

log = logging.getLogger(__name__)

DEFAULT_TENANT = "default"
ADMIN_TENANT = "admin"
ADMIN_TENANT_HEADER = "x-sandhive-tenant"


@asynccontextmanager
async def open_api_resources(settings: Settings) -> AsyncIterator[Resources]:
    """The process's `Resources`, and the task queue's consumer group made sure of."""
    async with open_resources(settings) as res:
        await _ensure_queue(res.redis)
        yield res


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
    """`Authorization: Bearer <key>`; on a WebSocket also `?token=<key>` (browsers set no
    headers) or HTTP Basic with the key as the password (a client that sets no headers
    sends the password of its URL, `ws://any:<key>@host/...`: OpenEnv's does)."""
    scheme, _, key = conn.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and key.strip():
        return key.strip()
    if conn.scope["type"] != "websocket":
        return None
    if scheme.lower() == "basic" and (password := _basic_password(key.strip())):
        return password
    return conn.query_params.get("token") or None


def _basic_password(credentials: str) -> str | None:
    try:
        decoded = base64.b64decode(credentials, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    return decoded.partition(":")[2] or None


async def current_tenant(conn: HTTPConnection, res: Res) -> str:
    """The caller's tenant (401 without a valid key), within its request rate (429).

    Everyone is `default` while auth is disabled. The admin key acts as the tenant
    named by `X-Sandhive-Tenant` (default `admin`). The stream route calls this
    itself after accepting, so its errors become WebSocket close codes (4401, 4429).
    """
    tenant = await _authenticate(conn, res)
    await within_rate(res, tenant)
    return tenant


async def _authenticate(conn: HTTPConnection, res: Resources) -> str:
    missing = "missing API key: send `Authorization: Bearer <key>`"
    return await tenant_of(conn, res, presented_key(conn), missing)


async def tenant_of(conn: HTTPConnection, res: Resources, key: str | None, missing: str) -> str:
    """The tenant `key` acts for (Unauthorized, saying `missing`, without one)."""
    if res.settings.auth == "disabled":
        return DEFAULT_TENANT
    if key is None:
        raise Unauthorized(missing)
    admin = res.settings.admin_api_key
    if keys.is_admin_key(key, admin.get_secret_value() if admin else None):
        return _admin_tenant(conn)
    tenant = await keys.authenticate(res.sessions, key)
    if tenant is None:
        raise Unauthorized("invalid or revoked API key")
    return tenant


def _admin_tenant(conn: HTTPConnection) -> str:
    name = conn.headers.get(ADMIN_TENANT_HEADER, ADMIN_TENANT)
    if not keys.TENANT_PATTERN.fullmatch(name):
        raise InvalidInput(f"{ADMIN_TENANT_HEADER}: not a valid tenant name")
    return name


async def within_rate(res: Resources, tenant: str) -> None:
    """429 with Retry-After past the tenant's budget; fails open when Redis is unreachable."""
    s = res.settings
    if s.rate_limit_per_s <= 0:
        return
    try:
        wait_s = await ratelimit.take(res.redis, tenant, s.rate_limit_per_s, s.rate_limit_burst)
    except (RedisError, OSError) as exc:
        log.warning("rate limiter unavailable, letting the request through: %r", exc)
        return
    if wait_s > 0:
        raise TooManyRequests(
            f"over the request rate of tenant {tenant!r} ({s.rate_limit_per_s:g}/s)",
            retry_after_s=max(1, math.ceil(wait_s)),
        )


Tenant = Annotated[str, Depends(current_tenant)]
