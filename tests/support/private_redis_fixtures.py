"""Fixtures that give a test package a Redis server of its own (real, private).

Imported by the conftests of tests/bus and tests/worker, so that no other test
flushing the shared DB 15 interferes: they override the root `redis` fixture
(flushed before each test) and point `settings` at the same server. Each
conftest that imports them gets its own server for the session.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from app.config import Settings
from tests.support.private_redis import running_redis


@pytest.fixture(scope="session")
def private_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One private redis-server for the importing package's session."""
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture
async def redis(private_redis_url: str) -> AsyncIterator[Redis]:
    """The private server, flushed, in place of the shared one."""
    client = Redis.from_url(private_redis_url)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture
def settings(settings: Settings, private_redis_url: str) -> Settings:
    """The root settings, pointed at the private server."""
    return settings.model_copy(update={"redis_url": private_redis_url})
