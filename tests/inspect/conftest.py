"""Fixtures of the Inspect provider's tests: one real Sandhive (API + worker) per module.

The provider is driven the way Inspect drives it, over HTTP with an API key, against
`sandhive serve` and `sandhive worker` subprocesses on the session's Postgres, Redis and
Docker. The server is module-scoped so that Inspect's conformance checks share one sandbox
(as Inspect's own runner shares one container); a missing service fails with what to start.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from app.config import Settings
from app.db.engine import create_engine, create_sessions
from app.scripted import ScriptedLLMServer
from app.services import keys
from tests.e2e.fault_harness import Cluster, cluster
from tests.support.settings import REDIS_URL, plain_settings

TENANT = "inspect-evals"


@dataclass(frozen=True)
class SandhiveAPI:
    """A running Sandhive and a key of tenant `TENANT` for it."""

    base_url: str
    key: str
    key_id: str
    cluster: Cluster


def make_key(database_url: str, tenant: str) -> keys.CreatedKey:
    async def create() -> keys.CreatedKey:
        engine = create_engine(database_url)
        try:
            return await keys.create_key(create_sessions(engine), tenant, "inspect tests")
        finally:
            await engine.dispose()

    return asyncio.run(create())


def flushed_redis() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.flushdb()
    except redis.ConnectionError as exc:
        pytest.fail(
            f"Redis unreachable at {REDIS_URL} ({exc}); start it: redis-server --daemonize yes "
            "--bind 127.0.0.1 --port 6379 --save '' --appendonly no",
            pytrace=False,
        )
    finally:
        client.close()


@pytest.fixture(scope="module")
def sandhive_api(
    database_url: str,
    docker_image: str,
    scripted_llm: ScriptedLLMServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SandhiveAPI]:
    """`sandhive serve` and one `sandhive worker`, API keys on, for the whole module."""
    flushed_redis()
    settings: Settings = plain_settings(
        database_url,
        sandbox_image=docker_image,
        llm_base_url=scripted_llm.base_url,
        llm_model="unset",
        auth="keys",
        sandbox_allow_writable_rootfs=True,  # Inspect's checks add a user (adduser)
    )
    created = make_key(database_url, TENANT)
    log_dir: Path = tmp_path_factory.mktemp("sandhive-inspect")
    with cluster(settings, log_dir) as procs:
        procs.start_api()
        worker = procs.start_worker("inspect-worker")
        log = log_dir / "inspect-worker.log"
        deadline = time.monotonic() + 60
        while "ready with" not in log.read_text(errors="replace"):
            assert worker.poll() is None, f"the worker exited early:\n{procs.logs()}"
            assert time.monotonic() < deadline, f"the worker never got ready:\n{procs.logs()}"
            time.sleep(0.05)
        yield SandhiveAPI(procs.base_url, created.key, created.id, procs)
