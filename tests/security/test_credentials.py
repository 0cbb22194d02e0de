"""Redis and Postgres with a password (RELIABILITY C3): the service works through URLs with
credentials, and the same server refuses it without them (or with a wrong password).
Private servers on ports of their own."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import asyncpg
import pytest
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import AuthenticationError, ResponseError
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from app.api.app import create_app
from app.config import Settings
from app.db.engine import create_engine
from tests.api.conftest import serve
from tests.support.processes import free_port
from tests.support.settings import plain_settings

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


# Postgres with a password (RELIABILITY C3). The shared Postgres of this machine trusts every
# loopback connection (pg_hba `trust`), so it would accept any password, a wrong one too: the
# test starts a private cluster that checks passwords (scram-sha-256 over TCP) on a port of
# its own, and creates a throwaway role there. The cluster and the role go with the test.

PG_ROLE = "sandhive_pw_test"
PG_PASSWORD = "pg p@ss%w0rd/:x"
"""Characters that must be URL-encoded, and a `%` that Alembic's config would misread."""


def pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    assert found, f"{name} not found: apt-get install postgresql"
    return found[-1]


def as_postgres(args: list[str], check: bool = True) -> subprocess.CompletedProcess[bytes]:
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return subprocess.run(prefix + args, check=check, capture_output=True, timeout=120)


@dataclass(frozen=True)
class PasswordPostgres:
    port: int
    sockets: Path

    def url(self, password: str) -> str:
        secret = quote(password, safe="")
        return f"postgresql+asyncpg://{PG_ROLE}:{secret}@127.0.0.1:{self.port}/{PG_ROLE}"


@pytest.fixture
def password_postgres() -> Iterator[PasswordPostgres]:
    # Not under pytest's tmp_path: root's 0700 tree, which `postgres` cannot enter.
    root = Path(tempfile.mkdtemp(prefix="sandhive-pgpw-"))
    data, sockets = root / "pgdata", root / "sock"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sockets, "postgres")
    server = PasswordPostgres(free_port(), sockets)
    init = [pg_bin("initdb"), "-D", str(data), "-U", "postgres"]
    as_postgres([*init, "--auth-local=trust", "--auth-host=scram-sha-256"])
    opts = f"-p {server.port} -c listen_addresses=127.0.0.1 -k {sockets} -c fsync=off"
    try:
        as_postgres(
            [
                pg_bin("pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(root / "pg.log"),
                "-o",
                opts,
                "-w",
                "start",
            ]
        )
        admin = ["psql", "-h", str(sockets), "-p", str(server.port), "-U", "postgres", "-v"]
        escaped = PG_PASSWORD.replace("'", "''")
        as_postgres(
            [
                *admin,
                "ON_ERROR_STOP=1",
                "-c",
                f"CREATE ROLE {PG_ROLE} LOGIN PASSWORD '{escaped}'",
                "-c",
                f"CREATE DATABASE {PG_ROLE} OWNER {PG_ROLE}",
            ]
        )
        yield server
    finally:
        as_postgres(
            [pg_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], check=False
        )
        shutil.rmtree(root, ignore_errors=True)


def migrate(url: str) -> subprocess.CompletedProcess[str]:
    """`sandhive migrate`, the operator's command, with the URL from the environment."""
    env = {**os.environ, "SANDHIVE_DATABASE_URL": url}
    return subprocess.run(
        [str(Path(sys.executable).with_name("sandhive")), "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_postgres_credentials_in_the_url_work_and_a_wrong_password_is_refused(
    password_postgres: PasswordPostgres, redis: AsyncRedis
) -> None:
    good = password_postgres.url(PG_PASSWORD)
    migrated = migrate(good)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    engine = create_engine(good)
    try:
        async with engine.connect() as conn:
            row = (await conn.execute(text("SELECT current_user, count(*) FROM tasks"))).one()
            version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
    finally:
        await engine.dispose()
    assert tuple(row) == (PG_ROLE, 0)
    assert version  # the schema is at a revision, made by the role with the password
    async with serve(create_app(plain_settings(good))) as client:
        assert (await client.get("/readyz")).status_code == 200
        response = await client.post("/v1/tasks", json={"prompt": "p"})
        assert response.status_code == 202, response.text

    wrong = password_postgres.url("not-the-password")
    engine = create_engine(wrong)
    try:
        with pytest.raises(DBAPIError) as refused:
            async with engine.connect():
                pass
    finally:
        await engine.dispose()
    assert f'password authentication failed for user "{PG_ROLE}"' in str(refused.value)
    driver_error = refused.value.orig
    assert driver_error is not None
    assert isinstance(driver_error.__cause__, asyncpg.InvalidPasswordError)
    failed = migrate(wrong)
    assert failed.returncode != 0
    assert "password authentication failed" in failed.stderr
    assert "not-the-password" not in failed.stderr  # the error names the user, not the secret
    async with serve(create_app(plain_settings(wrong))) as client:
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["error"]["details"]["postgres"] == "failed"
