"""The team deployment: docker-compose.yml + deploy/compose.local.yml, brought up for real.

Builds every image from the locally built Debian base (no registry), starts
Postgres, Redis, migrate, API, worker and the scripted LLM with Debian's
`docker-compose`, submits the demo task through the API's published port,
watches it finish over the WebSocket, runs a task with egress by domain name
(the `egress-firewall` one-shot's host rules and marker in place, an upstream server
on a network the test makes: without the marker the task fails closed and the demo
task still runs; with it an allowed name answers, another is refused and is a
`network.blocked` event), scales workers to 2, and tears it all down, checking
that nothing of the project is left behind.
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

from app.sandbox.host_rules import MARKER
from app.scripted import DEMO_ANSWER, DEMO_MODEL, DEMO_PROMPT
from tests.security.egress_upstreams import Upstream, remove_proxy, upstream_servers
from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
FILES = ["docker-compose.yml", "deploy/compose.local.yml", "tests/e2e/compose.test.yml"]
SANDBOX_IMAGE = "sandhive-sandbox:compose-test"


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    base_url: str
    instance: str
    upstream_bridge: str = ""
    """The Linux bridge of the egress proxy's upstream network (the test's own)."""
    egress_dir: Path | None = None
    """SANDHIVE_SANDBOX_EGRESS_PROXY_DIR: the proxy's files and egress-firewall's marker."""

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
    mine = f"sandhive.instance={instance}"
    queries = {
        "container": ["docker", "ps", "-aq", "--filter", owned],
        "network": ["docker", "network", "ls", "-q", "--filter", owned],
        "task network": ["docker", "network", "ls", "-q", "--filter", f"label={mine}"],
        "volume": ["docker", "volume", "ls", "-q", "--filter", owned],
        "sandbox": ["docker", "ps", "-aq", "--filter", f"label={mine}"],
    }
    found = []
    for kind, args in queries.items():
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout.split()
        found += [f"{kind}:{item}" for item in out]
    return found


def egress_settings(upstream: Upstream, project: str, folder: Path) -> dict[str, str]:
    """Egress by domain name through the proxy, its names answered with the test's upstream."""
    return {
        "SANDHIVE_SANDBOX_EGRESS_ENABLED": "true",
        "SANDHIVE_SANDBOX_EGRESS_PROXY": "true",
        "SANDHIVE_SANDBOX_EGRESS_DOMAINS": "good.test,other.test",
        "SANDHIVE_SANDBOX_EGRESS_PROXY_CONTAINER": f"{project}-egress-proxy",
        "SANDHIVE_SANDBOX_EGRESS_PROXY_NETWORK": upstream.network,
        "SANDHIVE_SANDBOX_EGRESS_PROXY_DIR": str(folder),
        "SANDHIVE_SANDBOX_EGRESS_PROXY_SUBNETS": "10.216.0.0/16",
        "SANDHIVE_SANDBOX_EGRESS_PROXY_EXEMPT": upstream.subnet,
        "SANDHIVE_SANDBOX_EGRESS_PROXY_HOSTS": ",".join(
            f"{name}={upstream.address}" for name in ("good.test", "other.test")
        ),
    }


def network_bridge(name: str) -> str:
    """The Linux bridge of a network the test made (Docker's default name)."""
    args = ["docker", "network", "inspect", "-f", "{{.Id}}", name]
    return "br-" + subprocess.run(args, capture_output=True, text=True, check=True).stdout[:12]


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
        "SANDHIVE_SANDBOX_IMAGE": SANDBOX_IMAGE,
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
    (tmp_path / "upstream").mkdir()
    upstreams = upstream_servers(tmp_path / "upstream", image=SANDBOX_IMAGE)
    try:
        stack.compose("build")  # first: the test's `llm` service runs the service image
        upstream = next(upstreams)  # before `up`: egress-firewall reads its bridge
        stack.upstream_bridge = network_bridge(upstream.network)
        stack.egress_dir = tmp_path / "egress"
        egress = egress_settings(upstream, project, stack.egress_dir)
        with env_file.open("a") as file:
            file.write("".join(f"{key}={value}\n" for key, value in egress.items()))
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
        remove_proxy(f"{project}-egress-proxy")  # the worker started it, on the upstream's network
        upstreams.close()
        subprocess.run(["docker", "rmi", SANDBOX_IMAGE], capture_output=True, check=False)


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


def host_rules(tool: str, chain: str) -> str:
    args = [tool, "-w", "10", "-S", chain]
    return subprocess.run(args, capture_output=True, text=True, check=False).stdout


def run_task(stack: Stack, client: httpx.Client, body: dict) -> tuple[str, list[dict]]:
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 202, response.text
    task_id = response.json()["id"]
    ws_url = stack.base_url.replace("http", "ws") + f"/v1/tasks/{task_id}/stream?after=0"
    events, code = asyncio.run(asyncio.wait_for(watch(ws_url), 300))
    assert code == 1000, stack.logs()
    return task_id, events


def check_marker(stack: Stack) -> Path:
    """egress-firewall's marker (app.sandbox.host_rules): this boot, the upstream bridge."""
    assert stack.egress_dir is not None
    marker = stack.egress_dir / MARKER
    body = json.loads(marker.read_text())
    assert body["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert body["bridge"] == stack.upstream_bridge, body
    assert body["addresses"], body  # the host's, read on the host's network
    return marker


def check_fail_closed(stack: Stack, client: httpx.Client, body: dict) -> None:
    """Without the marker (rules gone, as after a reboot) a proxied task fails; others run."""
    check_marker(stack).unlink()
    task_id, _ = run_task(stack, client, body)
    failed = client.get(f"/v1/tasks/{task_id}").json()
    assert (failed["status"], failed["finish_reason"]) == ("failed", "sandbox_error"), failed
    assert "egress-firewall" in failed["error"], failed
    task_id, _ = run_task(stack, client, {"prompt": DEMO_PROMPT})
    assert client.get(f"/v1/tasks/{task_id}").json()["status"] == "succeeded"


def check_egress_by_name(stack: Stack, client: httpx.Client) -> None:
    """The one-shot's host rules are in place, once each however often it runs, with its
    marker; without the marker proxied tasks fail closed; a proxied task reaches its name,
    not another."""
    sandbox = {"network": "egress", "allow_domains": ["good.test"]}
    body = {"prompt": "fetch", "llm": {"model": "egress-fetch"}, "sandbox": sandbox}
    check_fail_closed(stack, client, body)
    stack.compose("run", "--rm", "egress-firewall")  # a second `up`'s run: nothing doubles
    check_marker(stack)
    for tool in ("iptables", "ip6tables"):
        assert host_rules(tool, "INPUT").count("-A INPUT -j SHV-IN-proxied") == 1, tool
        chain = host_rules(tool, "SHV-IN-proxied")
        assert chain.count("-A SHV-IN-proxied -i shvp+ -j DROP") == 1, (tool, chain)
        upstream = f"-i {stack.upstream_bridge} -m conntrack --ctstate INVALID,NEW -j DROP"
        assert chain.count(upstream) == 1, (tool, chain)
    task_id, events = run_task(stack, client, body)
    finished = [event for event in events if event["type"] == "task.finished"]
    assert finished, events
    assert finished[0]["data"]["status"] == "succeeded", (events, stack.logs())
    steps = client.get(f"/v1/tasks/{task_id}/trajectory").json()["steps"]
    seen = steps[0]["observation"]
    assert "hello good.test /compose" in seen, seen
    assert "other=403" in seen, seen
    blocked = [event["data"]["host"] for event in events if event["type"] == "network.blocked"]
    assert blocked == ["other.test"], events


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
        check_egress_by_name(stack, client)

    assert wait_for(lambda: workers_alive(stack.base_url) == 1, "one worker")
    healthy = wait_for(lambda: worker_health(stack) == ["healthy"], "the worker's /readyz")
    assert healthy, stack.logs()
    stack.compose("up", "-d", "--no-recreate", "--scale", "worker=2")
    assert wait_for(lambda: workers_alive(stack.base_url) == 2, "two workers"), stack.logs()

    stack.compose("down", "-v", "--remove-orphans", "-t", "10")
    assert leftovers(stack.project, stack.instance) == []
