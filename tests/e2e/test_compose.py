"""The team deployment: docker-compose.yml + deploy/compose.local.yml, brought up for real.

Builds every image from the locally built Debian base (no registry), starts
Postgres, Redis, migrate, API, worker and the scripted LLM with Debian's
`docker-compose`, submits the demo task through the API's published port,
watches it finish over the WebSocket, scales workers to 2, and tears it all
down, checking that nothing of the project is left behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families

from app.scripted import DEMO_ANSWER, DEMO_MODEL, DEMO_PROMPT
from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
FILES = ["docker-compose.yml", "deploy/compose.local.yml", "tests/e2e/compose.test.yml"]


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    base_url: str
    instance: str

    def command(self) -> list[str]:
        command = [
            "docker-compose",
            "-p",
            self.project,
            "--env-file",
            self.env["SANDHIVE_ENV_FILE"],
        ]
        for name in FILES:
            command += ["-f", str(ROOT / name)]
        return command

    def compose(self, *args: str, timeout: float = 600) -> str:
        command = self.command()
        done = subprocess.run(
            [*command, *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
        return done.stdout

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--tail", "200")


def build_wheelhouse() -> None:
    """The service's dependencies as wheels, for an image built without an index."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--wheel-dir",
            str(ROOT / "deploy/wheels"),
            str(ROOT),
            "async-timeout>=4.0.3",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )


def leftovers(project: str, instance: str) -> list[str]:
    """Containers, networks and volumes of the project, and sandboxes of its instance."""
    owned = f"label=com.docker.compose.project={project}"
    queries = {
        "container": ["docker", "ps", "-aq", "--filter", owned],
        "network": ["docker", "network", "ls", "-q", "--filter", owned],
        "volume": ["docker", "volume", "ls", "-q", "--filter", owned],
        "sandbox": ["docker", "ps", "-aq", "--filter", f"label=sandhive.instance={instance}"],
    }
    found = []
    for kind, args in queries.items():
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout.split()
        found += [f"{kind}:{item}" for item in out]
    return found


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    assert shutil.which("docker-compose"), "apt-get install docker-compose (deploy/setup-host.sh)"
    build_wheelhouse()
    project = f"shvtest{uuid.uuid4().hex[:8]}"
    port = free_port()
    env_file = tmp_path / "env"
    settings = {
        "POSTGRES_PASSWORD": uuid.uuid4().hex,
        "REDIS_PASSWORD": uuid.uuid4().hex,
        "SANDHIVE_API_PORT": str(port),
        "SANDHIVE_SERVICE_IMAGE": "sandhive:compose-test",
        "SANDHIVE_SANDBOX_IMAGE": "sandhive-sandbox:compose-test",
        "SANDHIVE_AUTH": "disabled",
        "SANDHIVE_RATE_LIMIT_PER_S": "0",
        "SANDHIVE_LLM_BASE_URL": "http://llm:8001/v1",
        "SANDHIVE_LLM_MODEL": DEMO_MODEL,
        "SANDHIVE_INSTANCE": project,
        "SANDHIVE_WORKER_CONCURRENCY": "1",
        "SANDHIVE_WORKER_HEARTBEAT_S": "1",
        "SANDHIVE_WORKER_SHUTDOWN_GRACE_S": "5",
        "SANDHIVE_WORKER_METRICS_PORT": "9101",
        "SANDHIVE_LOG_FORMAT": "json",
    }
    env_file.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHIVE_")}
    env |= {
        "SANDHIVE_ENV_FILE": str(env_file),
        "COMPOSE_DOCKER_CLI_BUILD": "0",
        "DOCKER_BUILDKIT": "0",
    }
    stack = Stack(project, env, f"http://127.0.0.1:{port}", project)
    try:
        stack.compose("build")  # first: the test's `llm` service runs the service image
        stack.compose("up", "-d")
        yield stack
    finally:
        subprocess.run(
            [*stack.command(), "down", "-v", "--remove-orphans", "-t", "10"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=300,
            check=False,
        )
        subprocess.run(
            ["docker", "rmi", "sandhive-sandbox:compose-test"], capture_output=True, check=False
        )


def wait_for(check, what: str, timeout_s: float = 180):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result = check()
        except httpx.HTTPError:
            result = None
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


async def watch(url: str) -> tuple[list[dict], int | None]:
    events: list[dict] = []
    async with websockets.connect(url, open_timeout=10) as ws:
        try:
            async for message in ws:
                events.append(json.loads(message))
        except websockets.ConnectionClosed:
            pass
        return events, ws.close_code


def workers_alive(base_url: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        if family.name == "sandhive_workers":
            return float(family.samples[0].value)
    return 0.0


def worker_health(stack: Stack) -> list[str]:
    """Docker's health status of each worker container (its healthcheck is the worker's /readyz)."""
    ids = stack.compose("ps", "-q", "worker").split()
    inspect = ["docker", "inspect", "--format", "{{.State.Health.Status}}", *ids]
    return subprocess.run(inspect, capture_output=True, text=True, check=True).stdout.split()


def test_compose_stack_runs_a_task_and_scales(stack: Stack) -> None:
    ready = wait_for(
        lambda: httpx.get(f"{stack.base_url}/readyz", timeout=5).status_code == 200, "the API"
    )
    assert ready, stack.logs()
    with httpx.Client(base_url=stack.base_url, timeout=10) as client:
        response = client.post("/v1/tasks", json={"prompt": DEMO_PROMPT})
        assert response.status_code == 202, response.text
        task_id = response.json()["id"]
        ws_url = stack.base_url.replace("http", "ws") + f"/v1/tasks/{task_id}/stream?after=0"
        events, code = asyncio.run(asyncio.wait_for(watch(ws_url), 300))
        assert code == 1000, stack.logs()
        finished = [event for event in events if event["type"] == "task.finished"]
        assert finished, events
        assert finished[0]["data"]["status"] == "succeeded", stack.logs()
        assert client.get(f"/v1/tasks/{task_id}").json()["answer"] == DEMO_ANSWER

    assert wait_for(lambda: workers_alive(stack.base_url) == 1, "one worker")
    healthy = wait_for(lambda: worker_health(stack) == ["healthy"], "the worker's /readyz")
    assert healthy, stack.logs()
    stack.compose("up", "-d", "--no-recreate", "--scale", "worker=2")
    assert wait_for(lambda: workers_alive(stack.base_url) == 2, "two workers"), stack.logs()

    stack.compose("down", "-v", "--remove-orphans", "-t", "10")
    assert leftovers(stack.project, stack.instance) == []
