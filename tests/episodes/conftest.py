"""Fixtures of the episode tests: a real `sandhive worker` process holding the sandboxes and
the API in process, both on the test Postgres and Redis, with API keys on (tenants)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
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
def make_episode_settings(
    make_settings: Callable[..., Settings], docker_image: str, scripted_llm: ScriptedLLMServer
) -> Callable[..., Settings]:
    """Keys on, fast heartbeats (a dead worker is noticed within a few seconds), short waits.

    The lease is 4 s, not 1 s: a CPU-starved CI start let a 1 s lease lapse while the worker
    was alive, and a step then ended with "no answer from its worker"."""

    def make(**overrides: Any) -> Settings:
        return make_settings(
            **{
                "sandbox_image": docker_image,
                "llm_base_url": scripted_llm.base_url,
                "llm_model": "unset",
                "auth": "keys",
                "admin_api_key": ADMIN_KEY,
                "worker_heartbeat_s": 0.2,
                "worker_lease_s": 4.0,
                "episode_open_timeout_s": 60.0,
                "episode_step_timeout_s": 60.0,
                **overrides,
            }
        )

    return make


@pytest.fixture
def episode_settings(make_episode_settings: Callable[..., Settings]) -> Settings:
    return make_episode_settings()


@pytest.fixture
def worker(episode_settings: Settings, tmp_path: Path) -> Iterator[AppProcess]:
    with ready_worker(episode_settings, tmp_path / "worker.log") as process:
        yield process


@pytest.fixture
async def api(episode_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(create_app(episode_settings)) as client:
        client.timeout = httpx.Timeout(120.0)
        yield client


NO_WORKER_GRACE_S = 10.0
"""How long a just-started worker's heartbeat may be missing: its lease is short (a dead
worker is noticed soon), which a CPU-starved CI machine can let lapse for a moment."""


async def open_episode(api: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    deadline = time.monotonic() + NO_WORKER_GRACE_S
    while True:
        response = await api.post("/v1/episodes", json=body, headers=ALICE)
        lapsed = response.status_code == 503 and "no worker is running" in response.text
        if not lapsed or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert response.status_code == 201, response.text
    opened: dict[str, Any] = response.json()
    return opened


def tool_turn(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An assistant message in the OpenAI chat shape with one tool call."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


async def wait_for(what: str, check: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


ANSWER_FILE = "/testbed/output/answer.txt"


def write_answer(text: str) -> dict[str, Any]:
    args = {"command": "create", "path": ANSWER_FILE, "file_text": text}
    return tool_turn("c1", "str_replace_editor", args)


SUBMIT = tool_turn("c2", "submit", {})


async def step(
    api: httpx.AsyncClient, episode_id: str, message: dict[str, Any], headers: Any = None
) -> httpx.Response:
    return await api.post(
        f"/v1/episodes/{episode_id}/step", json={"message": message}, headers=headers or ALICE
    )


def containers(label: str) -> list[str]:
    found = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={label}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return found.stdout.split()


async def sandbox_gone(label: str, timeout_s: float = 20.0) -> None:
    """Until no container carries `label`: an ended episode's sandbox goes in the background,
    after its final step answered."""

    async def none_left() -> bool:
        return not containers(label)

    await wait_for(f"the containers labelled {label} to be removed", none_left, timeout_s)
