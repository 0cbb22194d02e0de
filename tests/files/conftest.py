"""Fixtures of the running-task file tests: a real `sandhive worker` process holding the
sandbox, the API in process, API keys on (two tenants), and a scripted model whose task
sets up files (a symlink escape among them) and then sleeps, so it keeps running."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.app import create_app
from app.config import Settings
from app.scripted import ScriptedLLMServer
from app.scripted.script import Script, Turn
from tests.api.conftest import serve
from tests.support.experiments import ADMIN_KEY, as_tenant
from tests.support.processes import ready_worker
from tests.support.zygote import AppProcess

ALICE = as_tenant("alice")
BOB = as_tenant("bob")
SETUP = " && ".join(
    [
        "mkdir -p output/deep/er",
        "printf 'hello files\\n' > output/answer.txt",
        "ln -s /etc esc",  # a link out of the writable area, planted by the agent
        "ln -s /etc/passwd output/passwd",
        "ln -s /testbed/output/answer.txt /tmp/inside",  # a link that stays inside
        "head -c 300000 /dev/urandom > output/big.bin",
        "head -c 150000 /dev/urandom > output/mid.bin",
        "sha256sum output/mid.bin > output/mid.sha",
        "mkfifo output/fifo",
        "echo ready > /tmp/ready",
    ]
)


@pytest.fixture
def files_settings(
    make_settings: Callable[..., Settings], docker_image: str, scripted_llm: ScriptedLLMServer
) -> Settings:
    return make_settings(
        sandbox_image=docker_image,
        llm_base_url=scripted_llm.base_url,
        llm_model="unset",
        auth="keys",
        admin_api_key=ADMIN_KEY,
        worker_heartbeat_s=0.2,
        worker_lease_s=1.0,
        task_files_max_read_bytes=200_000,
        task_files_max_write_bytes=100_000,
        task_files_timeout_s=5.0,
        warm_pool_size=0,
    )


@pytest.fixture
def worker(files_settings: Settings, tmp_path: Path) -> Iterator[AppProcess]:
    """The worker; afterwards (killed) its sandboxes are removed, not left to the reaper."""
    try:
        with ready_worker(files_settings, tmp_path / "worker.log") as process:
            yield process
    finally:
        label = f"label=sandhive.instance={files_settings.instance_name()}"
        found = subprocess.run(
            ["docker", "ps", "-aq", "--filter", label], capture_output=True, text=True, check=True
        ).stdout.split()
        if found:
            subprocess.run(["docker", "rm", "-f", *found], capture_output=True, check=False)


@pytest.fixture
async def api(files_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(create_app(files_settings)) as client:
        client.timeout = httpx.Timeout(60.0)
        yield client


@pytest.fixture
def sleeper(scripted_llm: ScriptedLLMServer) -> str:
    """A model that sets the files up, then runs a command that outlives the test."""
    model = f"files-{uuid.uuid4().hex[:8]}"
    turns = [
        Turn(tool="execute_bash", arguments={"command": SETUP}),
        Turn(tool="execute_bash", arguments={"command": "sleep 600"}),
        Turn(tool="submit"),
    ]
    scripted_llm.add_script(model, Script(turns=turns))
    return model


@pytest.fixture
def freezer(scripted_llm: ScriptedLLMServer) -> str:
    """A model whose agent, once the files are set up, stops the sandbox's exec channel
    agent (SIGSTOP): every later request to the sandbox hangs, the worker stays alive."""
    model = f"files-frozen-{uuid.uuid4().hex[:8]}"
    freeze = "pkill -STOP -f 'end of the exec channel'; sleep 600"
    turns = [
        Turn(tool="execute_bash", arguments={"command": SETUP}),
        Turn(tool="execute_bash", arguments={"command": freeze}),
        Turn(tool="submit"),
    ]
    scripted_llm.add_script(model, Script(turns=turns))
    return model


async def submit(api: httpx.AsyncClient, model: str, headers: dict[str, str] = ALICE) -> str:
    body = {
        "prompt": "keep running",
        "llm": {"model": model},
        "limits": {"timeout_s": 900, "command_timeout_s": 900},
    }
    response = await api.post("/v1/tasks", json=body, headers=headers)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def wait_for(
    what: str,
    probe: Callable[[], Awaitable[Any]],
    timeout_s: float = 90,
    why: Callable[[], object] = lambda: "",
) -> Any:
    """Poll until probe() is truthy; a liveness bound, not a timed assertion."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"gave up waiting for {what}: {why()}"
        await asyncio.sleep(0.2)


async def running_with_files(api: httpx.AsyncClient, task_id: str) -> None:
    """Until the task runs and its setup command has left /tmp/ready."""

    last: list[str] = []

    async def ready() -> bool:
        response = await api.get(f"/v1/tasks/{task_id}/files//tmp/ready", headers=ALICE)
        last[:] = [response.text]
        return response.status_code == 200

    await wait_for("the task's files", ready, why=lambda: last)
