"""/healthz and /readyz against the real backends, and against ones that are down."""

from __future__ import annotations

import socket

import httpx
from redis.asyncio import Redis

from app.api.app import create_app
from app.bus import keys
from app.config import Settings
from tests.api.conftest import assert_error, serve


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_healthz(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


async def test_readyz_when_postgres_and_redis_answer(client: httpx.AsyncClient) -> None:
    response = await client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "postgres": "ok", "redis": "ok"}


async def test_readyz_is_503_naming_redis_when_redis_is_down(api_settings: Settings) -> None:
    down = api_settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{closed_port()}/0"})
    async with serve(create_app(down)) as client:
        assert (await client.get("/healthz")).status_code == 200
        error = assert_error(await client.get("/readyz"), 503, "not_ready")
    assert "redis" in error["message"]
    assert error["details"] == {"postgres": "ok", "redis": "failed"}


async def test_readyz_is_503_naming_postgres_when_postgres_is_down(api_settings: Settings) -> None:
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{closed_port()}/sandhive"
    async with serve(create_app(api_settings.model_copy(update={"database_url": url}))) as client:
        error = assert_error(await client.get("/readyz"), 503, "not_ready")
    assert "postgres" in error["message"]
    assert error["details"] == {"postgres": "failed", "redis": "ok"}


async def test_startup_creates_the_workers_consumer_group(
    client: httpx.AsyncClient, redis: Redis
) -> None:
    groups = await redis.xinfo_groups(keys.TASK_STREAM)
    assert [group["name"] for group in groups] == [keys.WORKER_GROUP.encode()]
