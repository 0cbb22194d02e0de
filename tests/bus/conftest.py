"""A Redis server of this package's own (real, private), so no other test flushing DB 15 interferes.

Overrides the root `redis` fixture (flushed before each test) and points
`settings` at the same server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from app.config import Settings
from tests.support.private_redis import running_redis


@pytest.fixture(scope="session")
def private_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture
async def redis(private_redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(private_redis_url)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture
def settings(settings: Settings, private_redis_url: str) -> Settings:
    return settings.model_copy(update={"redis_url": private_redis_url})
