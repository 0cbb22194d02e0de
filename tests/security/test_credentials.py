"""Redis with a password (RELIABILITY C3): the service works through a URL with credentials,
and the same Redis refuses it without them. A private redis-server on a port of its own."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis
from redis.exceptions import AuthenticationError, ResponseError

from app.api.app import create_app
from app.config import Settings
from tests.api.conftest import serve
from tests.services.rows import plain_settings
from tests.support.processes import free_port

PASSWORD = "redis-test-password-9f3c"


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[int]:
    server = shutil.which("redis-server")
    assert server, "redis-server is needed (apt-get install redis-server)"
    port = free_port()
    proc = subprocess.Popen(
        [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--requirepass",
            PASSWORD,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                Redis(port=port, password=PASSWORD).ping()
                break
            except OSError:
                time.sleep(0.05)
            except Exception:
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_redis_refuses_a_client_without_the_password(private_redis: int) -> None:
    with pytest.raises((AuthenticationError, ResponseError)):
        Redis(port=private_redis).set("x", "1")


async def test_the_api_works_with_a_redis_url_carrying_credentials(
    clean_db: str, private_redis: int
) -> None:
    good = plain_settings(clean_db, redis_url=f"redis://:{PASSWORD}@127.0.0.1:{private_redis}/0")
    async with serve(create_app(good)) as client:
        assert (await client.get("/readyz")).status_code == 200
        response = await client.post("/v1/tasks", json={"prompt": "p"})
        assert response.status_code == 202, response.text
    assert Redis(port=private_redis, password=PASSWORD).xlen("sandhive:tasks") == 1
    bad: Settings = plain_settings(clean_db, redis_url=f"redis://127.0.0.1:{private_redis}/0")
    async with serve(create_app(bad)) as client:
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["error"]["details"]["redis"] == "failed"
