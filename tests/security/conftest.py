"""Fixtures for the security tests: settings with API keys on, keys of two tenants."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
import pytest

from app.api.app import create_app
from app.config import Settings
from app.db.engine import Sessions
from app.services import keys
from tests.api.conftest import serve

ADMIN_KEY = "admin-key-for-tests-" + "x" * 24


@dataclass(frozen=True)
class TenantKeys:
    a: str
    """A key of tenant `tenant-a`."""
    b: str
    """A key of tenant `tenant-b`."""
    revoked: str
    """A revoked key of tenant `tenant-a`."""


@pytest.fixture
def keyed_settings(make_settings: Callable[..., Settings]) -> Settings:
    """Real Postgres and Redis, API keys required, no rate limit (tests that want one add it)."""
    return make_settings(auth="keys", admin_api_key=ADMIN_KEY)


@pytest.fixture
async def tenant_keys(sessions: Sessions) -> TenantKeys:
    a = await keys.create_key(sessions, "tenant-a", "a")
    b = await keys.create_key(sessions, "tenant-b", "b")
    old = await keys.create_key(sessions, "tenant-a", "old")
    await keys.revoke_key(sessions, old.id)
    return TenantKeys(a=a.key, b=b.key, revoked=old.key)


@pytest.fixture
async def keyed_client(keyed_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(create_app(keyed_settings)) as client:
        yield client


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
