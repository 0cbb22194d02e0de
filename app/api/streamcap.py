"""The per-tenant cap on open event streams, as the stream routes use it.

A tenant may hold `SANDHIVE_STREAM_MAX_PER_TENANT` WebSocket + SSE streams at
once across all API processes (the count lives in Redis, app/bus/streamslots.py).
Past it a WebSocket is closed with 4429 and an SSE request answered 429 with
`Retry-After`: without a cap one tenant could hold every connection an API
process serves (`SANDHIVE_API_MAX_CONNECTIONS`) and every Redis reader of the
live hub. A held slot is refreshed every `SLOT_REFRESH_S` (or keepalive, if
shorter) and expires after `SLOT_TTL_FACTOR` of those, so the slots of a crashed
API are free again by the time its viewers reconnect elsewhere: a browser
EventSource gives up for good on a 429, so a stale slot must not outlive ~15 s.
Like the request-rate limiter, the cap fails open when Redis is unreachable.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator

from redis.exceptions import RedisError
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.bus import streamslots
from app.config import Settings
from app.errors import TooManyRequests
from app.kit.periodic import Periodic
from app.resources import Resources

log = logging.getLogger(__name__)

SLOT_REFRESH_S = 5.0
SLOT_REFRESH_MIN_S = 1.0
"""Tests shorten keepalives; a refresh a busy loop delays must still come before expiry."""
SLOT_TTL_FACTOR = 3
"""A slot survives this many missed refreshes (a slow Redis call) before it expires."""


def refresh_every_s(settings: Settings) -> float:
    return max(SLOT_REFRESH_MIN_S, min(SLOT_REFRESH_S, settings.stream_keepalive_s))


class StreamSlot:
    """One taken slot: refresh it while the stream is open, give it back when it ends."""

    def __init__(self, res: Resources, tenant: str, stream_id: str | None) -> None:
        self._res = res
        self._tenant = tenant
        self._id = stream_id  # None: not counted (Redis was unreachable)

    @property
    def _every_s(self) -> float:
        return refresh_every_s(self._res.settings)

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Keep the slot alive for the block; give it back on the way out."""
        refresher = Periodic()
        refresher.start(self._every_s, "stream slot refresh", self._refresh, now=False)
        try:
            yield
        finally:
            await refresher.stop()
            await self.give_back()

    async def give_back(self) -> None:
        """Free the slot (at most once)."""
        stream_id, self._id = self._id, None
        if stream_id is None:
            return
        try:
            await streamslots.give_back(self._res.redis, self._tenant, stream_id)
        except (RedisError, OSError) as exc:  # it expires on its own
            log.warning("could not free a stream slot of %s: %r", self._tenant, exc)

    async def _refresh(self) -> None:
        if self._id is None:
            return
        try:
            await streamslots.refresh(
                self._res.redis, self._tenant, self._id, self._every_s * SLOT_TTL_FACTOR
            )
        except (RedisError, OSError) as exc:
            log.warning("could not refresh a stream slot of %s: %r", self._tenant, exc)


async def take_slot(res: Resources, tenant: str) -> StreamSlot:
    """A slot of the tenant's stream cap, or TooManyRequests (429; WebSocket 4429)."""
    s = res.settings
    stream_id = uuid.uuid4().hex
    try:
        taken = await streamslots.take(
            res.redis,
            tenant,
            stream_id,
            s.stream_max_per_tenant,
            refresh_every_s(s) * SLOT_TTL_FACTOR,
        )
    except (RedisError, OSError) as exc:
        log.warning("stream cap unavailable, letting the stream open: %r", exc)
        return StreamSlot(res, tenant, None)
    if not taken:
        raise TooManyRequests(
            f"too many open streams for this tenant (limit {s.stream_max_per_tenant})",
            retry_after_s=s.backpressure_retry_after_s,
        )
    return StreamSlot(res, tenant, stream_id)


@contextlib.asynccontextmanager
async def stream_slot(res: Resources, tenant: str) -> AsyncIterator[None]:
    """Hold one of the tenant's stream slots for the block (a WebSocket's life)."""
    slot = await take_slot(res, tenant)
    async with slot.held():
        yield


class HoldingSlot(Response):
    """An SSE response that holds `slot` while it is sent and gives it back when it ends.

    Wrapping the whole ASGI call (not the body) frees the slot however the
    response ends, also when the client leaves before the first byte. Only a
    response that is never called (the app failing between route and send) would
    leave its slot to expire on its own after `SLOT_TTL_FACTOR` refreshes.
    """

    def __init__(self, inner: Response, slot: StreamSlot) -> None:
        # Not Response.__init__: the inner response renders status, headers and body.
        self.status_code = inner.status_code
        self.background = None
        self.raw_headers = inner.raw_headers
        self._inner = inner
        self._slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with self._slot.held():
            await self._inner(scope, receive, send)
        if self.background is not None:
            await self.background()
