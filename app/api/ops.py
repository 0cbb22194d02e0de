"""Operational endpoints: `/healthz` (the process answers) and `/readyz` (its backends do)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from fastapi import APIRouter
from sqlalchemy import text

from app.api.deps import Res
from app.errors import NotReady
from app.resources import Resources
from app.schemas.tasks import ErrorOut

log = logging.getLogger(__name__)
router = APIRouter(tags=["ops"])

CHECK_TIMEOUT_S = 2.0


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"model": ErrorOut}})
async def readyz(res: Res) -> dict[str, str]:
    """200 only when Postgres and Redis both answer; else 503 naming the ones that did not."""
    names = ("postgres", "redis")
    results = await asyncio.gather(_check(_ping_postgres(res)), _check(_ping_redis(res)))
    checks = {name: "ok" if ok else "failed" for name, ok in zip(names, results, strict=True)}
    failed = [name for name, state in checks.items() if state != "ok"]
    if failed:
        raise NotReady(f"not ready: {', '.join(failed)} did not answer", details=checks)
    return {"status": "ok", **checks}


async def _check(probe: Awaitable[None]) -> bool:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            await probe
    except Exception as exc:  # any failure means "not ready", whatever the driver raised
        log.warning("readiness check failed: %r", exc)
        return False
    return True


async def _ping_postgres(res: Resources) -> None:
    async with res.engine.connect() as conn:
        await conn.execute(text("SELECT 1"))


async def _ping_redis(res: Resources) -> None:
    await res.redis.ping()
