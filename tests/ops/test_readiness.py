"""/readyz against a Postgres and a Redis of the test's own, stopped and started under it.

Private instances on free loopback ports (initdb + pg_ctl as the `postgres`
user; `redis-server`), never the shared ones.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from app.api.app import create_app
from app.config import Settings
from tests.api.conftest import assert_error, serve
from tests.support.private_redis import running_redis
from tests.support.processes import free_port
from tests.support.settings import plain_settings


def pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    assert found, f"{name} not found: apt-get install postgresql"
    return found[-1]


def as_postgres(args: list[str]) -> None:
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    subprocess.run(prefix + args, check=True, capture_output=True, timeout=60)


class PrivatePostgres:
    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.data = root / "pgdata"
        self.log = root / "pg.log"
        self.sockets = root / "sock"

    def init(self) -> None:
        self.sockets.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.data.parent, "postgres")
            shutil.chown(self.sockets, "postgres")
        as_postgres([pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"])

    def start(self) -> None:
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.sockets} -c fsync=off"
        as_postgres(
            [pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "start"]
        )

    def stop(self) -> None:
        as_postgres([pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    # Not under pytest's tmp_path: that is root's 0700 tree, which `postgres` cannot enter.
    root = Path(tempfile.mkdtemp(prefix="sandhive-pg-"))
    server = PrivatePostgres(root)
    server.init()
    server.start()
    try:
        yield server
    finally:
        subprocess.run(
            [
                "runuser",
                "-u",
                "postgres",
                "--",
                pg_bin("pg_ctl"),
                "-D",
                str(server.data),
                "-m",
                "immediate",
                "stop",
            ],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(root, ignore_errors=True)


async def test_readyz_follows_a_private_postgres_going_down_and_up(
    private_postgres: PrivatePostgres, clean_db: str, redis: Redis
) -> None:
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{private_postgres.port}/postgres"
    settings: Settings = plain_settings(url)
    async with serve(create_app(settings)) as client:
        assert (await client.get("/readyz")).status_code == 200
        private_postgres.stop()
        error = assert_error(await client.get("/readyz"), 503, "not_ready")
        assert error["details"] == {"postgres": "failed", "redis": "ok"}
        assert (await client.get("/healthz")).status_code == 200
        private_postgres.start()
        assert (await client.get("/readyz")).status_code == 200


async def test_readyz_follows_a_private_redis_going_down_and_up(
    tmp_path: Path, clean_db: str
) -> None:
    with running_redis(tmp_path) as server:
        settings = plain_settings(clean_db, redis_url=server.url)
        async with serve(create_app(settings)) as client:
            assert (await client.get("/readyz")).status_code == 200
            server.kill()
            error = assert_error(await client.get("/readyz"), 503, "not_ready")
            assert error["details"] == {"postgres": "ok", "redis": "failed"}
            server.start()
            assert (await client.get("/readyz")).status_code == 200
