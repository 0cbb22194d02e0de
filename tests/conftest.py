"""Fixtures over the real things: Postgres, Redis, Docker and the scripted LLM.

A missing dependency fails the test with a message that says what to start;
nothing here is faked but the model.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from app.config import Settings
from app.db.engine import Sessions, create_engine, create_sessions
from app.resources import Resources, open_resources
from app.scripted import ScriptedLLMServer
from tests.support.container_audit import SandboxAuditor
from tests.support.database import create_database, drop_database, upgrade_to_head
from tests.support.parallel import UnitScheduling, rank
from tests.support.sandbox_cleanup import remove_sandboxes
from tests.support.settings import REDIS_URL, plain_settings

ADMIN_URL = os.environ.get(
    "SANDHIVE_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
SANDBOX_IMAGE = os.environ.get("SANDHIVE_TEST_SANDBOX_IMAGE", "sandhive-sandbox:latest")
TABLES = (
    "events, steps, artifacts, task_inputs, tasks, api_keys, "
    "experiment_events, experiment_items, experiments, episodes, "
    "webhook_subscriptions, webhook_deliveries, sandbox_commands, sandboxes, image_builds"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest units of work first (tests/support/parallel.py); a stable sort, so each
    module keeps its own order."""
    items.sort(key=lambda item: rank(item.nodeid))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> UnitScheduling | None:
    """Under `pytest -n N`: whole modules, and whole named groups, per worker."""
    if config.getvalue("dist") in ("load", "loadscope", "loadgroup"):
        return UnitScheduling(config, log)
    return None


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A fresh database for this test session, built by `alembic upgrade head`."""
    name = f"sandhive_test_{os.getpid()}"
    try:
        asyncio.run(create_database(ADMIN_URL, name))
    except (OSError, asyncpg.PostgresError) as exc:
        pytest.fail(
            f"Postgres unreachable at {ADMIN_URL} ({exc}); start it: "
            "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
            pytrace=False,
        )
    url = ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://") + "/" + name
    upgrade_to_head(url)
    yield url
    asyncio.run(drop_database(ADMIN_URL, name))


@pytest.fixture
async def clean_db(database_url: str) -> str:
    """The session database with every table emptied before the test."""
    conn = await asyncpg.connect(database_url.replace("+asyncpg", ""))
    try:
        await conn.execute(f"TRUNCATE {TABLES} CASCADE")
    finally:
        await conn.close()
    return database_url


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    """A dedicated Redis database, flushed before each test."""
    client = Redis.from_url(REDIS_URL)
    try:
        await client.ping()
    except OSError as exc:
        pytest.fail(
            f"Redis unreachable at {REDIS_URL} ({exc}); start it: redis-server --daemonize yes "
            "--bind 127.0.0.1 --port 6379 --save '' --appendonly no",
            pytrace=False,
        )
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture(scope="session", autouse=True)
def sandbox_audit() -> Iterator[SandboxAuditor]:
    """Audits every sandbox container the suite starts (RELIABILITY I-09); fails the session
    at the end if any was weaker than the policy (tests/support/container_audit.py)."""
    auditor = SandboxAuditor()
    auditor.start()
    yield auditor
    auditor.stop()
    if auditor.violations:
        pytest.fail(
            f"sandboxes weaker than the policy: {auditor.violations} (the watcher sees every "
            "Sandhive container on this Docker host: code that makes sandboxes outside a "
            "deployment must label them sandhive.test, sandhive.bench or sandhive.local)",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def docker_image() -> str:
    """The sandbox image; fails with instructions when Docker or the image is missing."""
    probe = subprocess.run(
        ["docker", "image", "inspect", SANDBOX_IMAGE], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        pytest.fail(
            f"Docker or the sandbox image {SANDBOX_IMAGE} is not available "
            f"({probe.stderr.strip()}); start dockerd and run: sandhive image build --offline",
            pytrace=False,
        )
    return SANDBOX_IMAGE


@pytest.fixture(scope="session")
def scripted_llm() -> Iterator[ScriptedLLMServer]:
    """One scripted OpenAI-compatible server for the session; tests add scripts by model name."""
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
def make_settings(clean_db: str, redis: Redis) -> Callable[..., Settings]:
    """Settings on the test Postgres and Redis; pass what the test needs on top.

    The base is `plain_settings` (tests/support/settings.py): an LLM profile nobody
    calls, no API keys, no rate limit. Nothing here needs Docker or the scripted LLM.
    """

    def make(**overrides: Any) -> Settings:
        return plain_settings(clean_db, **overrides)

    return make


@pytest.fixture
def settings(
    make_settings: Callable[..., Settings], docker_image: str, scripted_llm: ScriptedLLMServer
) -> Settings:
    """Settings wired to the real test services, the sandbox image and the scripted LLM."""
    return make_settings(
        sandbox_image=docker_image,
        llm_base_url=scripted_llm.base_url,
        llm_model="unset",
        llm_retry_backoff_s=0.05,
        worker_concurrency=2,
    )


@pytest.fixture
async def sessions(clean_db: str) -> AsyncIterator[Sessions]:
    """Sessions on the clean test database, on an engine of their own (no Redis, no Settings)."""
    engine = create_engine(clean_db)
    yield create_sessions(engine)
    await engine.dispose()


@pytest.fixture
async def res(make_settings: Callable[..., Settings]) -> AsyncIterator[Resources]:
    """Engine, sessions and Redis opened the way every process opens them (app/resources.py)."""
    async with open_resources(make_settings()) as res:
        yield res


@pytest.fixture
def no_sandbox_left(database_url: str) -> Iterator[None]:
    """After the test, the `/v1/sandboxes` containers of the session's instance go: autouse
    it where tests make sandboxes (their workers are SIGKILLed, not stopped)."""
    yield
    remove_sandboxes(database_url.rsplit("/", 1)[-1].split("?")[0])
