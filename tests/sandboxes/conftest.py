"""Fixtures of the sandbox API tests: a real `sandhive worker` process holding the
sandboxes and the API in process, on the test Postgres, Redis and Docker, with API keys on
(tenants)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.app import create_app
from app.config import Settings
from app.scripted import ScriptedLLMServer
from tests.api.conftest import serve
from tests.support.experiments import ADMIN_KEY, as_tenant
from tests.support.processes import ready_worker
from tests.support.zygote import AppProcess

ALICE = as_tenant("alice")
BOB = as_tenant("bob")


@pytest.fixture
def make_sandbox_settings(
    make_settings: Callable[..., Settings], docker_image: str, scripted_llm: ScriptedLLMServer
) -> Callable[..., Settings]:
    """Keys on, fast heartbeats (a dead worker is noticed within a second)."""

    def make(**overrides: Any) -> Settings:
        return make_settings(
            **{
                "sandbox_image": docker_image,
                "llm_base_url": scripted_llm.base_url,
                "llm_model": "unset",
                "auth": "keys",
                "admin_api_key": ADMIN_KEY,
                "worker_heartbeat_s": 0.2,
                "worker_lease_s": 1.0,
                "worker_reap_interval_s": 1.0,
                # Containers a test's SIGKILLed worker leaves are gone in minutes at worst.
                "sandbox_max_lifetime_s": 300,
                **overrides,
            }
        )

    return make


@pytest.fixture
def sandbox_settings(make_sandbox_settings: Callable[..., Settings]) -> Settings:
    return make_sandbox_settings()


@pytest.fixture
def worker(sandbox_settings: Settings, tmp_path: Path) -> Iterator[AppProcess]:
    with ready_worker(sandbox_settings, tmp_path / "worker.log") as process:
        yield process


@pytest.fixture
async def api(sandbox_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(create_app(sandbox_settings)) as client:
        client.timeout = httpx.Timeout(120.0)
        yield client


async def create(api: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await api.post("/v1/sandboxes", json=body, headers=ALICE)
    assert response.status_code == 201, response.text
    made: dict[str, Any] = response.json()
    return made


async def run(api: httpx.AsyncClient, sandbox_id: str, **body: Any) -> dict[str, Any]:
    response = await api.post(f"/v1/sandboxes/{sandbox_id}/exec", json=body, headers=ALICE)
    assert response.status_code == 200, response.text
    done: dict[str, Any] = response.json()
    return done


@pytest.fixture(autouse=True)
def _no_sandbox_left(no_sandbox_left: None) -> None:
    """A test's sandboxes go with it: its worker is SIGKILLed, not stopped."""
