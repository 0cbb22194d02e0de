"""`egress` sandboxes through the real path (RELIABILITY N-17, N-19, N-20, I-12).

Everything a probe may reach is on this machine and made by the test: two
"outside" networks with a listener each (one allow-listed, one not), a TCP
listener on the host's own addresses, a second egress sandbox, and for the
default (empty) allow-list a network namespace standing in for a public
address and for the metadata service. No name is ever looked up (Docker's
resolver would forward the query off the machine).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.sandbox import DockerHost
from app.sandbox.network import chain_names, ensure_network, install_firewall, remove_firewall
from app.sandbox.policy import CA_BUNDLE_PATH, EgressPolicy
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.security.test_sandbox_attacks import (
    PRIVATE_REDIS,
    observations,
    wait_finished,
    wait_removed,
)
from tests.support.processes import Service, running_service

IMAGE = "sandhive-sandbox:latest"
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
PROBE = """
import concurrent.futures, json, socket, sys, urllib.request
targets = json.load(open(sys.argv[1]))
def probe(target):
    name, host, port = target
    try:
        socket.create_connection((host, port), timeout=1.5).close()
        return name, "open"
    except OSError as exc:
        return name, type(exc).__name__
with concurrent.futures.ThreadPoolExecutor(64) as pool:
    for name, result in pool.map(probe, targets):
        print(name, result)
print("allowed-http", urllib.request.urlopen(sys.argv[2], timeout=5).read().decode().strip())
"""


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def container_ip(name: str) -> str:
    return run(
        "docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", name
    )


@dataclass
class Outside:
    """The test's stand-ins for "the Internet" (allowed) and "an internal network" (not)."""

    allowed_ip: str
    internal_ip: str


@pytest.fixture
def outside() -> Iterator[Outside]:
    tag = f"shvt-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    names = {"internet": f"{tag}-internet", "internal": f"{tag}-internal"}
    try:
        for role, name in names.items():
            run("docker", "network", "create", name)
            body = f"echo {role}-answer > index.html && python3 -m http.server 8080"
            run(
                "docker",
                "run",
                "-d",
                "--name",
                name,
                "--network",
                name,
                "-w",
                "/tmp",
                IMAGE,
                "sh",
                "-c",
                body,
            )
        yield Outside(container_ip(names["internet"]), container_ip(names["internal"]))
    finally:
        for name in names.values():
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
            subprocess.run(["docker", "network", "rm", name], capture_output=True, check=False)


class HostListener:
    """A TCP listener on every host address that counts who connects."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("0.0.0.0", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[str] = []
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, peer = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted.append(peer[0])
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def host_listener() -> Iterator[HostListener]:
    listener = HostListener()
    yield listener
    listener.close()


async def set_up(policy: EgressPolicy) -> str:
    """Network and firewall, as the worker sets them up; the network's gateway."""
    async with DockerHost() as host:
        await ensure_network(host.api(), policy)
        await install_firewall(policy)
        info = await (await host.api().networks.get(policy.network)).show()
        return str(info["IPAM"]["Config"][0]["Gateway"])


def egress_network(policy: EgressPolicy) -> Iterator[tuple[EgressPolicy, str]]:
    """Set up the policy's network and firewall for one test, then remove them."""
    try:
        yield policy, asyncio.run(set_up(policy))
    finally:
        asyncio.run(remove_firewall(policy))
        for cid in run("docker", "ps", "-aq", "--filter", f"network={policy.network}").split():
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)
        subprocess.run(
            ["docker", "network", "rm", policy.network], capture_output=True, check=False
        )


@pytest.fixture
def egress(outside: Outside) -> Iterator[tuple[EgressPolicy, str]]:
    """The deployment's egress network (names of the test's own) and firewall: (policy, gateway)."""
    suffix = f"{os.getpid() % 100000}"
    policy = EgressPolicy(
        network=f"shv-test-egress-{suffix}", bridge=f"shvt{suffix}", allow=(outside.allowed_ip,)
    )
    yield from egress_network(policy)


@pytest.fixture
def open_egress() -> Iterator[tuple[EgressPolicy, str]]:
    """The default policy: an empty allow-list (any public address, never a private one)."""
    suffix = f"{os.getpid() % 100000}"
    policy = EgressPolicy(network=f"shv-test-open-{suffix}", bridge=f"shvo{suffix}", allow=())
    yield from egress_network(policy)


def settings_for(settings: Settings, policy: EgressPolicy) -> Settings:
    return settings.model_copy(
        update={
            "redis_url": PRIVATE_REDIS,
            "sandbox_egress_enabled": True,
            "sandbox_egress_network": policy.network,
            "sandbox_egress_bridge": policy.bridge,
            "sandbox_egress_allow": list(policy.allow),
            "sandbox_ca_bundle": Path(HOST_CA),
        }
    )


def start_service(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    import redis

    client = redis.Redis.from_url(PRIVATE_REDIS)
    client.flushdb()
    client.close()
    with running_service(settings, tmp_path) as svc:
        yield svc


@pytest.fixture
def service(
    settings: Settings, egress: tuple[EgressPolicy, str], tmp_path: Path
) -> Iterator[Service]:
    yield from start_service(settings_for(settings, egress[0]), tmp_path)


@pytest.fixture
def open_service(
    settings: Settings, open_egress: tuple[EgressPolicy, str], tmp_path: Path
) -> Iterator[Service]:
    yield from start_service(settings_for(settings, open_egress[0]), tmp_path)


@dataclass
class Public:
    """A stand-in for "a public address" and for the metadata service, in a network namespace
    of the test's own behind a veth pair: nothing the probes send leaves this machine."""

    address: str
    host_side: str
    """This machine's own address on the veth (a host address: must stay unreachable)."""


PUBLIC_NET = "203.0.113"
"""TEST-NET-3 (RFC 5737): outside every range the firewall blocks, never routed on the Internet."""
METADATA = "169.254.169.254"


@pytest.fixture
def public(open_egress: tuple[EgressPolicy, str], tmp_path: Path) -> Iterator[Public]:
    policy, _ = open_egress
    tag = f"{os.getpid() % 100000}"
    ns, outer, inner, table = (
        f"shvt-pub-{tag}",
        f"shvp{tag}",
        f"shvq{tag}",
        str(4000 + int(tag) % 1000),
    )
    subnet = json.loads(
        run("docker", "network", "inspect", "-f", "{{json .IPAM.Config}}", policy.network)
    )[0]["Subnet"]
    served = tmp_path / "public"
    served.mkdir()
    (served / "index.html").write_text("public-answer\n")
    server: subprocess.Popen[bytes] | None = None
    try:
        run("ip", "netns", "add", ns)
        run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns)
        run("ip", "addr", "add", f"{PUBLIC_NET}.1/30", "dev", outer)
        run("ip", "link", "set", outer, "up")
        run("ip", "-n", ns, "addr", "add", f"{PUBLIC_NET}.2/30", "dev", inner)
        run("ip", "-n", ns, "addr", "add", f"{METADATA}/32", "dev", inner)
        run("ip", "-n", ns, "link", "set", inner, "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")
        run("ip", "-n", ns, "route", "add", "default", "via", f"{PUBLIC_NET}.1")
        # Only the egress network's traffic to the metadata address is steered into the
        # namespace: were the firewall to let it pass, it would still never leave the machine.
        run("ip", "route", "add", f"{METADATA}/32", "via", f"{PUBLIC_NET}.2", "table", table)
        run("ip", "rule", "add", "from", subnet, "to", f"{METADATA}/32", "table", table)
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "http.server", "80"],
            cwd=served,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_serving(ns, f"{PUBLIC_NET}.2")
        yield Public(address=f"{PUBLIC_NET}.2", host_side=f"{PUBLIC_NET}.1")
    finally:
        if server is not None:
            server.kill()
            server.wait(timeout=10)
        for argv in (
            ("ip", "rule", "del", "from", subnet, "to", f"{METADATA}/32", "table", table),
            ("ip", "route", "flush", "table", table),
            ("ip", "link", "del", outer),
            ("ip", "netns", "del", ns),
        ):
            subprocess.run(argv, capture_output=True, check=False)


def wait_serving(ns: str, address: str) -> None:
    code = f"import socket; socket.create_connection(({address!r}, 80), 1).close()"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        probe = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", code], capture_output=True
        )
        if probe.returncode == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"the stand-in public server on {address} did not start")


def host_addresses() -> list[str]:
    """Every IPv4 address of this machine but loopback (which inside a sandbox is its own)."""
    out = run("ip", "-4", "-o", "addr", "show")
    addresses = [line.split()[3].split("/")[0] for line in out.splitlines()]
    return [a for a in addresses if not a.startswith("127.")]


def test_egress_reaches_only_the_allow_list_never_the_host_or_other_sandboxes(
    service: Service,
    scripted_llm: ScriptedLLMServer,
    egress: tuple[EgressPolicy, str],
    outside: Outside,
    host_listener: HostListener,
) -> None:
    policy, gateway = egress
    neighbour = start_neighbour(policy)
    try:
        neighbour_ip = container_ip(neighbour)
        api_port = int(service.base_url.rsplit(":", 1)[1])
        ports = [5432, 6379, api_port, 2375, 2376, 22, host_listener.port]
        targets: list[Any] = [
            [f"host:{address}:{port}", address, port]
            for address in sorted({gateway, *host_addresses()})
            for port in ports
        ]
        targets += [
            ["internal-network", outside.internal_ip, 8080],
            ["neighbour-sandbox", neighbour_ip, 8000],
            ["metadata", "169.254.169.254", 80],  # dropped at our own bridge: never leaves
            ["allowed", outside.allowed_ip, 8080],
        ]
        url = f"http://{outside.allowed_ip}:8080/"
        scripted_llm.add_script("egress-probe", probe_script(targets, url))
        task, seen = run_probe(service.base_url, "egress-probe")
    finally:
        subprocess.run(["docker", "rm", "-f", neighbour], capture_output=True, check=False)
    assert task["status"] == "succeeded", (task, seen, service.logs()[-3000:])
    results = dict(line.split(" ", 1) for line in seen[2].splitlines() if line.count(" ") == 1)
    assert results["allowed"] == "open"
    assert "allowed-http internet-answer" in seen[2]
    blocked = {name: r for name, r in results.items() if name not in ("allowed", "allowed-http")}
    assert len(blocked) == len(targets) - 1
    assert all(r != "open" for r in blocked.values()), blocked
    assert host_listener.accepted == []  # nothing from a sandbox reached the host
    assert f"ca={CA_BUNDLE_PATH}" in seen[3]
    assert "ca-ok" in seen[3]
    assert "Read-only file system" in seen[3]
    assert "No such file or directory" in seen[3]
    wait_removed(task["id"])


def run_probe(base_url: str, model: str) -> tuple[dict[str, Any], list[str]]:
    """Submit the probe task in an egress sandbox; its end state and observations."""
    with httpx.Client(base_url=base_url, timeout=30) as client:
        response = client.post(
            "/v1/tasks",
            json={
                "prompt": "probe",
                "llm": {"model": model},
                "sandbox": {"network": "egress", "memory_mb": 256, "disk_mb": 64},
                "limits": {"command_timeout_s": 60},
            },
        )
        assert response.status_code == 202, response.text
        task_id = response.json()["id"]
        return wait_finished(client, task_id, 120), observations(client, task_id)


def probe_script(targets: list[Any], allowed_url: str) -> Script:
    return Script(
        turns=[
            Turn(
                tool="str_replace_editor",
                arguments={"command": "create", "path": "/testbed/probe.py", "file_text": PROBE},
            ),
            Turn(
                tool="str_replace_editor",
                arguments={
                    "command": "create",
                    "path": "/testbed/targets.json",
                    "file_text": json.dumps(targets),
                },
            ),
            Turn(
                tool="execute_bash",
                arguments={
                    "command": f"python3 /testbed/probe.py /testbed/targets.json {allowed_url}"
                },
            ),
            Turn(
                tool="execute_bash",
                arguments={
                    "command": f"echo ca=$SSL_CERT_FILE; test -s {CA_BUNDLE_PATH} && echo ca-ok; "
                    f"echo x >> {CA_BUNDLE_PATH}; ls /var/run/docker.sock; echo done"
                },
            ),
            Turn(tool="submit", arguments={}),
        ]
    )


def start_neighbour(policy: EgressPolicy) -> str:
    """A container on the same egress network, listening on 8000 (another tenant's sandbox)."""
    return run(
        "docker",
        "run",
        "-d",
        "--rm",
        "--network",
        policy.network,
        "--cap-drop",
        "ALL",
        IMAGE,
        "python3",
        "-m",
        "http.server",
        "8000",
    )


def test_with_an_empty_allow_list_public_addresses_answer_and_nothing_private_does(
    open_service: Service,
    scripted_llm: ScriptedLLMServer,
    open_egress: tuple[EgressPolicy, str],
    outside: Outside,
    public: Public,
    host_listener: HostListener,
) -> None:
    """The default policy, live: a public address is reachable, so the sandbox has a network;
    the host, the service's networks, a neighbour sandbox and the metadata address are not."""
    policy, gateway = open_egress
    neighbour = start_neighbour(policy)
    try:
        neighbour_ip = container_ip(neighbour)
        api_port = int(open_service.base_url.rsplit(":", 1)[1])
        ports = [5432, 6379, api_port, 2375, 2376, 22, host_listener.port]
        addresses = sorted({gateway, public.host_side, *host_addresses()})
        targets: list[Any] = [
            [f"host:{address}:{port}", address, port] for address in addresses for port in ports
        ]
        targets += [
            ["internal-network", outside.internal_ip, 8080],  # a service network stand-in
            ["other-network", outside.allowed_ip, 8080],  # allow-listed only in the other test
            ["neighbour-sandbox", neighbour_ip, 8000],
            ["metadata", METADATA, 80],  # steered into the test's namespace, never off the host
            ["public", public.address, 80],
        ]
        scripted_llm.add_script(
            "egress-open-probe", probe_script(targets, f"http://{public.address}/")
        )
        task, seen = run_probe(open_service.base_url, "egress-open-probe")
    finally:
        subprocess.run(["docker", "rm", "-f", neighbour], capture_output=True, check=False)
    assert task["status"] == "succeeded", (task, seen, open_service.logs()[-3000:])
    results = dict(line.split(" ", 1) for line in seen[2].splitlines() if line.count(" ") == 1)
    assert results["public"] == "open", results
    assert "allowed-http public-answer" in seen[2]
    blocked = {name: r for name, r in results.items() if name not in ("public", "allowed-http")}
    assert len(blocked) == len(targets) - 1
    assert all(r != "open" for r in blocked.values()), blocked
    assert host_listener.accepted == []  # nothing from a sandbox reached the host
    wait_removed(task["id"])


def test_the_listener_is_reachable_without_the_firewall(host_listener: HostListener) -> None:
    """Negative control: on Docker's default bridge (no Sandhive rules) the host listener answers,
    so the refusals above are the firewall's doing, not a dead listener."""
    gateway = run("ip", "-4", "-o", "addr", "show", "docker0").split()[3].split("/")[0]
    code = f"import socket; socket.create_connection(({gateway!r}, {host_listener.port}), 3)"
    code += "; print('ok')"
    out = run("docker", "run", "--rm", IMAGE, "python3", "-c", code)
    assert out == "ok"
    deadline = time.monotonic() + 5
    while not host_listener.accepted and time.monotonic() < deadline:
        time.sleep(0.1)
    assert host_listener.accepted


def test_the_firewall_rules_are_in_place_and_idempotent(egress: tuple[EgressPolicy, str]) -> None:
    policy, _ = egress
    fwd, inp = chain_names(policy.bridge)
    asyncio.run(install_firewall(policy))  # twice: still one jump, same rules
    forward = run("iptables", "-S", fwd).splitlines()
    assert f"-A {fwd} -i {policy.bridge} -o {policy.bridge} -j DROP" in forward
    for cidr in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"):
        assert f"-A {fwd} -d {cidr} -i {policy.bridge} -j DROP" in forward
    assert f"-A {fwd} -d {policy.allow[0]}/32 -i {policy.bridge} -j ACCEPT" in forward
    assert forward[-2:] == [f"-A {fwd} -i {policy.bridge} -j DROP", f"-A {fwd} -j RETURN"]
    assert run("iptables", "-S", "DOCKER-USER").count(f"-j {fwd}") == 1
    assert run("iptables", "-S", "INPUT").count(f"-j {inp}") == 1
    assert f"-A {inp} -i {policy.bridge} -j DROP" in run("iptables", "-S", inp)
    options = json.loads(
        run("docker", "network", "inspect", "-f", "{{json .Options}}", policy.network)
    )
    assert options["com.docker.network.bridge.enable_icc"] == "false"
