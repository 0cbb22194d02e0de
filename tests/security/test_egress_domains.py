"""Egress by domain name through the service: submission checks, a real task, its events.

The API refuses `allow_domains` that widen the operator's ceiling (422 naming what is
allowed), or that come without proxied egress. A task run by a real worker reaches an
allowed name over HTTPS from its sandbox, is refused another; the refusal is a stored
`network.blocked` event (what the page shows) and counted on the worker's /metrics.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.security.egress_upstreams import Upstream, remove_proxy, upstream_servers
from tests.security.test_sandbox_attacks import observations, wait_finished, wait_removed
from tests.support.processes import Service, free_port, running_service


@dataclass
class Proxied:
    svc: Service
    metrics_url: str


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    yield from upstream_servers(tmp_path_factory.mktemp("upstream"))


@pytest.fixture
def service(settings: Settings, upstream: Upstream, tmp_path: Path) -> Iterator[Proxied]:
    container = f"shvt-proxy-svc-{tmp_path.name[-12:]}"
    configured = settings.model_copy(
        update={
            "sandbox_egress_enabled": True,
            "sandbox_egress_proxy": True,
            "sandbox_egress_domains": ["good.test", "*.ok.test", "other.test"],
            "sandbox_egress_default_domains": ["a.ok.test"],
            "sandbox_egress_proxy_container": container,
            "sandbox_egress_proxy_network": upstream.network,
            "sandbox_egress_proxy_dir": tmp_path / "egress",
            "sandbox_egress_proxy_subnets": "10.215.0.0/16",
            "sandbox_egress_proxy_exempt": [upstream.subnet],
            "sandbox_egress_proxy_hosts": [
                f"{name}={upstream.address}" for name in ("good.test", "a.ok.test", "other.test")
            ],
            "sandbox_ca_bundle": upstream.ca,
            "worker_metrics_port": free_port(),
        }
    )
    try:
        with running_service(configured, tmp_path) as svc:
            yield Proxied(svc, f"http://127.0.0.1:{configured.worker_metrics_port}/metrics")
    finally:
        remove_proxy(container)


def submit(client: httpx.Client, sandbox: dict[str, Any], model: str = "egress") -> httpx.Response:
    return client.post(
        "/v1/tasks",
        json={"prompt": "fetch", "llm": {"model": model}, "sandbox": sandbox},
    )


def test_allow_domains_are_checked_against_the_ceiling(service: Proxied) -> None:
    with httpx.Client(base_url=service.svc.base_url, timeout=30) as client:
        wider = submit(client, {"network": "egress", "allow_domains": ["good.test", "*.test"]})
        assert wider.status_code == 422, wider.text
        error = wider.json()["error"]
        assert "*.test" in error["message"]
        assert "allowed: good.test, *.ok.test, other.test" in error["message"]
        raw_ip = submit(client, {"network": "egress", "allow_domains": ["10.0.0.1"]})
        assert raw_ip.status_code == 422
        assert "IP address" in raw_ip.text
        no_egress = submit(client, {"network": "none", "allow_domains": ["good.test"]})
        assert no_egress.status_code == 422
        assert "egress" in no_egress.text


def sse_events(client: httpx.Client, task_id: str) -> list[dict[str, Any]]:
    text = client.get(f"/v1/tasks/{task_id}/events", params={"after": 0}).text
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


def test_a_task_reaches_its_names_and_its_refusals_are_events(
    service: Proxied, scripted_llm: ScriptedLLMServer
) -> None:
    fetch = (
        "curl -sS --max-time 15 https://good.test/task; "
        "curl -sS --max-time 15 -o /dev/null -w 'default=%{http_code}\\n' https://a.ok.test/; "
        "curl -sS --max-time 15 -o /dev/null -w 'other=%{http_code}\\n' http://other.test/"
    )
    scripted_llm.add_script(
        "egress-fetch",
        Script(
            turns=[Turn(tool="execute_bash", arguments={"command": fetch}), Turn(tool="submit")]
        ),
    )
    sandbox = {"network": "egress", "allow_domains": ["good.test"], "memory_mb": 256}
    with httpx.Client(base_url=service.svc.base_url, timeout=30) as client:
        created = submit(client, sandbox, model="egress-fetch")
        assert created.status_code == 202, created.text
        task_id = created.json()["id"]
        task = wait_finished(client, task_id, 120)
        assert task["status"] == "succeeded", (task, service.svc.logs()[-3000:])
        assert task["sandbox"]["allow_domains"] == ["good.test"]
        seen = observations(client, task_id)[0]
        assert "hello good.test /task" in seen, seen
        assert "default=000" in seen, seen  # not in this task's list, though the default
        assert "other=403" in seen, seen
        blocked = [e for e in sse_events(client, task_id) if e["type"] == "network.blocked"]
        hosts = [e["data"]["host"] for e in blocked]  # in the order the proxy refused them
        assert hosts == ["a.ok.test", "other.test"], blocked
        assert all(e["data"]["attempt"] == 1 for e in blocked)
        metrics = httpx.get(service.metrics_url).text
        assert "sandhive_worker_egress_blocked_total 2.0" in metrics
    wait_removed(task_id)
