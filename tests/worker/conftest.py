"""Fixtures of the worker tests.

A Redis server of this package's own (real, private), so no other test flushing DB 15
interferes: those fixtures live in `tests.support.private_redis_fixtures` (shared with
the other package that needs one); importing them here scopes them to this package.
The experiment tests' `fast` settings and their API `client` are here too.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import httpx
import pytest
from redis.asyncio import Redis

from app.api.app import create_app
from app.config import Settings
from app.resources import open_resources
from app.runner.episode import Runner
from app.sandbox.docker import DockerHost
from app.worker.context import WorkerContext
from app.worker.pool import Worker
from tests.api.conftest import serve
from tests.support.private_redis_fixtures import private_redis_url, redis, settings

__all__ = ["client", "ctx", "fast", "made", "private_redis_url", "redis", "settings"]


@pytest.fixture
def made() -> Iterator[list[str]]:
    """Ids of containers a test starts; all removed afterwards, whatever happened."""
    ids: list[str] = []
    yield ids
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, check=False)


@pytest.fixture
async def ctx(settings: Settings, redis: Redis) -> AsyncIterator[WorkerContext]:
    """A worker's context with fast heartbeats and leases and an instance of its own."""
    config = settings.model_copy(update={"worker_heartbeat_s": 0.2, "worker_lease_s": 1.0})
    async with open_resources(config) as res, DockerHost() as docker:
        yield WorkerContext.of(res, Runner(config, docker), "w-me", f"test-{uuid.uuid4().hex[:8]}")


@asynccontextmanager
async def running_worker(settings: Settings) -> AsyncIterator[Worker]:
    """An in-process worker running until the block ends; then stopped with no grace (what
    still runs is handed back at once)."""
    pool = Worker(settings)
    running = asyncio.create_task(pool.run())
    try:
        yield pool
    finally:
        pool.stop()
        pool.stop()
        await asyncio.wait_for(running, 60)


@pytest.fixture
def fast(settings: Settings) -> Settings:
    """For experiments: the advancing chore every 0.2 s, 4 items at once per worker, an
    item the service failed rerun after 0.1 s."""
    return settings.model_copy(
        update={
            "experiment_tick_s": 0.2,
            "worker_concurrency": 4,
            "experiment_retry_backoff_s": 0.1,
        }
    )


@pytest.fixture
async def client(fast: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The API, in process, on the `fast` settings."""
    async with serve(create_app(fast)) as client:
        yield client
