"""Egress by domain name through the real path: a sandbox, its own network, the proxy container.

The sandbox (Docker, the sandbox image, curl and python3 in it) reaches the test's
upstream only by allowed names, over HTTP and HTTPS (a CA made by the test), and every
other way out is shut: other names, raw IPs, names pointing at private, metadata or
loopback addresses, a forged SNI, a Host header naming another site, the upstream's
address without the proxy, the host itself. Each refusal reaches `on_blocked`. A worker
that leaves the host rules to compose's one-shot starts none without its marker.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from app.config import Settings
from app.errors import SandboxError
from app.resources import open_resources
from app.runner.episode import Runner
from app.sandbox import DockerHost, host_rules
from app.sandbox.docker import DockerSandbox
from app.sandbox.egress_policy import ProxyPolicy
from app.sandbox.egress_proxy import PROXY_SYSCTLS, TASK_NET_LABEL, bridge_of, install_host_rules
from app.sandbox.policy import EgressPolicy, SandboxConfig
from app.worker.context import WorkerContext
from app.worker.health import Readiness
from tests.security.egress_upstreams import (
    IMAGE,
    Upstream,
    private_address,
    remove_proxy,
    upstream_servers,
)

ALLOW = ("good.test", "*.ok.test", "private.test", "meta.test", "loop.test")
LABELS = {"sandhive.local": "1", "sandhive.task": "tsk_egress_test", "sandhive.attempt": "1"}
SNI_PROBE = r"""
import os, socket, ssl, sys
proxy = os.environ["HTTPS_PROXY"].removeprefix("http://")
host, port = proxy.rsplit(":", 1)
def tunnel(target):
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(f"CONNECT {target}:443 HTTP/1.1\r\nHost: {target}:443\r\n\r\n".encode())
    return s, s.recv(4096).decode().split("\r\n")[0]
s, status = tunnel("good.test")
ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
try:
    tls = ctx.wrap_socket(s, server_hostname="other.test")
    tls.sendall(b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
    print("sni-forged", status, tls.recv(100))
except (OSError, ssl.SSLError) as exc:
    print("sni-forged", status, "refused", type(exc).__name__)
s = socket.create_connection((host, int(port)), timeout=10)
s.sendall(b"GET http://good.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n")
print("host-forged", s.recv(4096).decode().split("\r\n")[0])
gateway = host.rsplit(".", 1)[0] + "." + str(int(host.rsplit(".", 1)[1]) - 1)
for target, port in [(gateway, 5432), (gateway, 6379), (gateway, 22), (sys.argv[1], 80)]:
    try:
        socket.create_connection((target, port), timeout=2).close()
        print("direct", target, port, "open")
    except OSError as exc:
        print("direct", target, port, type(exc).__name__)
# The sandbox has a default route through the bridge's gateway (the host): only the host's
# rules stand between it and a host port that listens on every address.
print("gateway", gateway)
for line in open("/proc/net/route").read().splitlines()[1:]:
    fields = line.split()
    if fields[1] == "00000000":
        print("route-default", socket.inet_ntoa(bytes.fromhex(fields[2])[::-1]))
try:
    socket.create_connection((gateway, int(sys.argv[2])), timeout=3).close()
    print("host-listener", "open")
except OSError as exc:
    print("host-listener", type(exc).__name__)
try:
    print("resolver", socket.getaddrinfo("good.test", 80))
except OSError as exc:
    print("resolver", "none", type(exc).__name__)
print("ipv6-off", open("/proc/sys/net/ipv6/conf/all/disable_ipv6").read().strip())
try:
    print("ipv6-addresses", len(open("/proc/net/if_inet6").read().split()))
except OSError:
    print("ipv6-addresses", 0)
for target in ["fe80::1", "ff02::2", "fe80::" + gateway.replace(".", ":")]:
    try:
        socket.create_connection((target + "%eth0", 22), timeout=2).close()
        print("direct6", target, "open")
    except OSError as exc:
        print("direct6", target, type(exc).__name__)
"""


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    yield from upstream_servers(tmp_path_factory.mktemp("upstream"))


@pytest.fixture
def proxy(upstream: Upstream, tmp_path: Path) -> Iterator[ProxyPolicy]:
    hosts = (
        *((name, upstream.address) for name in ("good.test", "a.ok.test", "other.test")),
        ("private.test", private_address(upstream.subnet)),
        ("meta.test", "169.254.169.254"),
        ("loop.test", "127.0.0.1"),
    )
    policy = ProxyPolicy(
        image=IMAGE,
        container=f"shvt-proxy-{tmp_path.name[-20:]}",
        upstream_network=upstream.network,
        control_dir=str(tmp_path / "egress"),
        subnets="10.214.0.0/16",
        max_connections=100,
        max_bytes=8 * 2**20,
        ports=(80, 443),
        exempt=(upstream.subnet,),
        hosts=hosts,
    )
    try:
        yield policy
    finally:
        remove_proxy(policy.container)


def config(policy: ProxyPolicy, upstream: Upstream, allow: tuple[str, ...]) -> SandboxConfig:
    egress = EgressPolicy(network="unused", bridge="unused", proxy=policy)
    return SandboxConfig(
        image=IMAGE,
        labels=LABELS,
        network="egress",
        egress=egress,
        allow_domains=allow,
        ca_bundle=str(upstream.ca),
        memory_mb=256,
        disk_mb=32,
    )


async def sh(box: DockerSandbox, command: str) -> str:
    result = await box.exec(["bash", "-c", command], timeout_s=60)
    return (result.stdout + result.stderr).decode(errors="replace").strip()


def curl(url: str, *extra: str) -> str:
    options = " ".join(("-sS --max-time 15 -o /dev/null -w '%{http_code}'", *extra))
    return f'curl {options} {url}; echo " rc=$?"'


def task_networks() -> list[str]:
    out = subprocess.run(
        ["docker", "network", "ls", "-q", "--filter", f"label={TASK_NET_LABEL}=1",
         "--filter", "label=sandhive.task=tsk_egress_test"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return out.split()


async def probe(
    policy: ProxyPolicy, upstream: Upstream, host_port: int
) -> tuple[dict[str, str], list[tuple[str, ...]]]:
    blocked: list[tuple[str, ...]] = []
    seen: dict[str, str] = {}
    async with DockerHost() as host:
        host.egress_gate.on_blocked = lambda *event: blocked.append(tuple(map(str, event)))
        box = await host.create_sandbox(config(policy, upstream, ALLOW))
        try:
            seen["env"] = await sh(box, "echo $HTTPS_PROXY $SSL_CERT_FILE")
            seen["http"] = await sh(box, "curl -sS --max-time 15 http://good.test/hi")
            seen["https"] = await sh(box, "curl -sS --max-time 15 https://good.test/hi")
            seen["wildcard"] = await sh(box, "curl -sS --max-time 15 https://a.ok.test/w")
            seen["python"] = await sh(
                box,
                'python3 -c "import urllib.request as u;'
                " print(u.urlopen('https://good.test/py', timeout=15).read().decode())\"",
            )
            for name, url in {
                "other-http": "http://other.test/",
                "other-https": "https://other.test/",
                "raw-ip-http": f"http://{upstream.address}/",
                "raw-ip-https": f"https://{upstream.address}/",
                "private": "http://private.test/",
                "metadata": "http://meta.test/",
                "loopback": "https://loop.test/",
            }.items():
                seen[name] = await sh(box, curl(url))
            await box.put_files("/testbed", [("sni.py", SNI_PROBE.encode())])
            seen["raw"] = await sh(box, f"python3 /testbed/sni.py {upstream.address} {host_port}")
            seen["networks-while-running"] = " ".join(task_networks())
        finally:
            await box.remove()
    return seen, blocked


def host_drops() -> int:
    """Packets the host's INPUT rule for the per-task bridges (SHV-IN-proxied) has dropped;
    0 before the first proxied sandbox installs the chain."""
    listed = subprocess.run(
        ["iptables", "-w", "-L", "SHV-IN-proxied", "-v", "-x", "-n"],
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode != 0:
        return 0
    listing = listed.stdout
    rows = [line.split() for line in listing.splitlines()[2:]]
    return sum(int(row[0]) for row in rows if row[2] == "DROP" and row[5].startswith("shvp"))


def test_allowed_names_work_and_every_other_way_out_is_refused(
    proxy: ProxyPolicy, upstream: Upstream
) -> None:
    # A host port listening on every address, the gateway's included.
    with socket.create_server(("0.0.0.0", 0)) as listener:
        dropped_before = host_drops()
        seen, blocked = asyncio.run(probe(proxy, upstream, listener.getsockname()[1]))
        dropped = host_drops() - dropped_before
    assert "http://10.214." in seen["env"]
    assert "/etc/sandhive/ca-bundle.crt" in seen["env"]
    assert seen["http"] == "hello good.test /hi", seen
    assert seen["https"] == "hello good.test /hi", seen
    assert seen["wildcard"] == "hello a.ok.test /w", seen
    assert seen["python"] == "hello good.test /py", seen
    assert seen["other-http"] == "403 rc=0", seen
    for refused in ("other-https", "raw-ip-https", "loopback"):
        assert seen[refused].startswith("000 rc=56"), seen  # CONNECT answered 403
        assert "403" in seen[refused], seen
    for refused in ("raw-ip-http", "private", "metadata"):
        assert seen[refused] == "403 rc=0", seen
    raw = dict(line.split(" ", 1) for line in seen["raw"].splitlines())
    assert raw["sni-forged"].startswith("HTTP/1.1 200"), raw  # the tunnel, then the cut
    assert "refused" in raw["sni-forged"], raw
    assert raw["host-forged"] == "HTTP/1.1 403 Forbidden", raw
    direct = [line for line in seen["raw"].splitlines() if line.startswith("direct ")]
    assert len(direct) == 4, direct
    assert not any(line.endswith("open") for line in direct), direct
    assert raw["resolver"].startswith("none"), raw
    # The route to the host is there; the host's INPUT rule for the task bridges dropped it.
    assert raw["route-default"] == raw["gateway"], raw
    assert raw["host-listener"] == "TimeoutError", raw
    assert dropped > 0, "the sandbox's packets to the host were not dropped by SHV-IN-proxied"
    assert raw["ipv6-off"] == "1", raw  # no fe80:: path to the host or the proxy
    assert raw["ipv6-addresses"] == "0", raw
    direct6 = [line for line in seen["raw"].splitlines() if line.startswith("direct6")]
    assert len(direct6) == 3, direct6
    assert not any(line.endswith("open") for line in direct6), direct6
    assert seen["networks-while-running"]
    assert task_networks() == []  # the task's network went with its sandbox
    reasons = {(host, reason.split(" ")[0]) for _task, _attempt, host, reason in blocked}
    assert {task for task, *_ in blocked} == {"tsk_egress_test"}
    for host, word in [
        ("other.test", "name"),
        (upstream.address, "raw"),
        ("private.test", "address"),
        ("meta.test", "address"),
        ("loop.test", "address"),
        ("good.test", "TLS"),
        ("good.test", "Host"),
    ]:
        assert (host, word) in reasons, (host, word, blocked)
    assert any("private" in reason for *_, reason in blocked)


async def capped(policy: ProxyPolicy, upstream: Upstream) -> tuple[list[str], str, list[str]]:
    reasons: list[str] = []
    async with DockerHost() as host:
        host.egress_gate.on_blocked = lambda _t, _a, _h, reason: reasons.append(reason)
        box = await host.create_sandbox(config(policy, upstream, ("good.test",)))
        try:
            codes = [await sh(box, curl("http://good.test/")) for _ in range(4)]
        finally:
            await box.remove()
        box = await host.create_sandbox(
            config(replace(policy, max_bytes=200_000), upstream, ("good.test",))
        )
        try:
            big = await sh(
                box,
                "curl -sS --max-time 15 -o /testbed/big http://good.test/big 2>/dev/null;"
                " echo rc=$? size=$(wc -c < /testbed/big)",
            )
        finally:
            await box.remove()
    return codes, big, reasons


def test_connection_and_byte_caps_cut_a_task_off(proxy: ProxyPolicy, upstream: Upstream) -> None:
    codes, big, reasons = asyncio.run(capped(replace(proxy, max_connections=3), upstream))
    assert codes == ["200 rc=0"] * 3 + ["403 rc=0"], codes
    rc, size = big.split()
    assert rc != "rc=0", big
    assert int(size.removeprefix("size=")) < 200_000, big
    assert "connection cap of 3 reached" in reasons
    assert "byte cap of 200000 reached" in reasons, reasons


def test_the_proxy_container_is_locked_down(proxy: ProxyPolicy, upstream: Upstream) -> None:
    async def start() -> None:
        async with DockerHost() as host:
            box = await host.create_sandbox(config(proxy, upstream, ("good.test",)))
            await box.remove()

    asyncio.run(start())
    info = json.loads(subprocess.run(
        ["docker", "inspect", proxy.container], capture_output=True, text=True, check=True
    ).stdout)[0]  # fmt: skip
    assert info["HostConfig"]["CapDrop"] == ["ALL"]
    assert info["HostConfig"]["ReadonlyRootfs"] is True
    assert "no-new-privileges" in info["HostConfig"]["SecurityOpt"]
    assert list(info["NetworkSettings"]["Networks"]) == [upstream.network]
    assert info["HostConfig"]["Sysctls"] == PROXY_SYSCTLS
    assert info["HostConfig"]["Ulimits"][0]["Name"] == "nofile"
    assert info["HostConfig"]["MemorySwap"] == info["HostConfig"]["Memory"]
    assert info["HostConfig"]["NanoCpus"] == 1_000_000_000
    assert info["HostConfig"]["LogConfig"]["Config"]["max-size"] == "10m"
    assert info["Config"]["Cmd"][:4] == ["python3", "-E", "-s", "-S"]
    assert info["Config"]["User"] == "65534:65534"  # the test runs as root, the proxy not
    assert not any("docker.sock" in m["Source"] for m in info["Mounts"])


def test_a_task_network_left_behind_is_swept_and_one_in_use_is_not(
    proxy: ProxyPolicy, upstream: Upstream
) -> None:
    async def leave_one() -> tuple[str, str, list[str], list[str]]:
        async with DockerHost() as host:
            box = await host.create_sandbox(config(proxy, upstream, ("good.test",)))
            try:
                orphan = await host.egress_gate.open(proxy, ("good.test",), LABELS)  # no sandbox
                in_use = task_networks()
                swept = await host.egress_gate.sweep(proxy, older_than_s=0)
                after = await sh(box, "curl -sS --max-time 15 http://good.test/still")
            finally:
                await box.remove()
            return orphan.name, after, in_use, swept

    orphan, after, in_use, swept = asyncio.run(leave_one())
    assert len(in_use) == 2
    assert swept == [orphan]
    assert after == "hello good.test /still"
    assert task_networks() == []


HOST_PROBE = r"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("open")
except OSError as exc:
    print(type(exc).__name__)
"""


def test_the_upstream_bridge_cannot_reach_the_host_and_a_restart_keeps_grants(
    proxy: ProxyPolicy, upstream: Upstream
) -> None:
    """The proxy's own side: no new connection from it to the host (a listener of the test's
    on the host's address on the upstream network); a restarted proxy gets the live grants
    back from the worker without the task doing anything."""
    gateway = str(ipaddress.ip_network(upstream.subnet)[1])
    listener = socket.create_server((gateway, 0))
    listener.settimeout(0)

    async def run() -> tuple[str, str, list[str]]:
        async with DockerHost() as host:
            box = await host.create_sandbox(config(proxy, upstream, ("good.test",)))
            try:
                before = await sh(box, "curl -sS --max-time 15 http://good.test/before")
                reach = (await asyncio.to_thread(
                    subprocess.run,
                    ["docker", "exec", proxy.container, "python3", "-c", HOST_PROBE,
                     gateway, str(listener.getsockname()[1])],
                    capture_output=True, text=True, check=False,
                )).stdout.strip()  # fmt: skip
                restart = ["docker", "restart", "-t", "1", proxy.container]
                await asyncio.to_thread(subprocess.run, restart, check=True)
                after = []
                for _ in range(30):  # until the worker re-granted (it reconnects by itself)
                    after.append(await sh(box, "curl -sS --max-time 5 http://good.test/after"))
                    if after[-1] == "hello good.test /after":
                        break
                    await asyncio.sleep(1)
            finally:
                await box.remove()
            return before, reach, after

    try:
        before, reach, after = asyncio.run(run())
    finally:
        listener.close()
    assert before == "hello good.test /before"
    assert reach == "TimeoutError", reach  # dropped, not refused: the host never answered
    assert after[-1] == "hello good.test /after", after


async def refused_start(host: DockerHost, policy: ProxyPolicy, upstream: Upstream) -> str:
    """The error a proxied sandbox fails with; nothing of it is left."""
    with pytest.raises(SandboxError) as caught:
        await host.create_sandbox(config(policy, upstream, ("good.test",)))
    assert task_networks() == []
    return caught.value.message


async def fetch_good(host: DockerHost, policy: ProxyPolicy, upstream: Upstream) -> str:
    box = await host.create_sandbox(config(policy, upstream, ("good.test",)))
    try:
        return await sh(box, curl("http://good.test/hi"))
    finally:
        await box.remove()


def test_a_worker_that_leaves_the_host_rules_to_the_one_shot_needs_its_marker(
    proxy: ProxyPolicy, upstream: Upstream
) -> None:
    """Compose's worker (`manage_firewall` off) starts no proxied sandbox unless the marker of
    `install_host_rules` (the egress-firewall one-shot's code) is of this boot and names the
    upstream bridge; the host addresses it lists are refused in every grant."""
    policy = replace(proxy, manage_firewall=False)
    control = Path(policy.control_dir)
    gateway = str(ipaddress.ip_network(upstream.subnet)[1])  # the host, on the upstream bridge

    async def run() -> tuple[list[str], dict[str, object], list[str]]:
        async with DockerHost() as host:
            errors = [await refused_start(host, policy, upstream)]  # never installed
            bridge = await install_host_rules(policy)
            marker = json.loads(host_rules.marker_path(control).read_text())
            seen = [await fetch_good(host, policy, upstream)]
            host_rules.marker_path(control).write_text(json.dumps({**marker, "boot_id": "x"}))
            errors.append(await refused_start(host, policy, upstream))  # a reboot since
            host_rules.write_marker(control, "br-elsewhere", [])
            errors.append(await refused_start(host, policy, upstream))  # another bridge
            host_rules.write_marker(control, bridge, [upstream.address])  # "a host address"
            seen.append(await fetch_good(host, policy, upstream))
            return errors, marker, seen

    errors, marker, seen = asyncio.run(run())
    assert all("egress-firewall" in error for error in errors), errors
    assert "no " in errors[0], errors
    assert "before the host's last boot" in errors[1], errors
    assert "names upstream bridge br-elsewhere" in errors[2], errors
    assert marker["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert gateway in marker["addresses"], marker  # read in the host's network namespace
    assert seen == ["200 rc=0", "403 rc=0"], seen  # the marker's address is refused


async def test_the_workers_readiness_says_whether_the_marker_confirms_the_rules(
    settings: Settings, upstream: Upstream, tmp_path: Path
) -> None:
    """`egress` in /readyz (compose's worker only): the marker's problem, then ok."""
    control = tmp_path / "egress"
    proxied = settings.model_copy(
        update={
            "sandbox_egress_enabled": True,
            "sandbox_egress_proxy": True,
            "sandbox_egress_firewall": False,
            "sandbox_egress_proxy_network": upstream.network,
            "sandbox_egress_proxy_dir": control,
        }
    )
    readiness = Readiness()
    async with open_resources(proxied) as res, DockerHost() as docker:
        ctx = WorkerContext.of(res, Runner(proxied, docker), "w-ready", "t")
        await readiness.check(ctx)
        before = readiness.report()
        info = await (await docker.api().networks.get(upstream.network)).show()
        host_rules.write_marker(control, bridge_of(info), [])
        await readiness.check(ctx)
        after = readiness.report()
    assert before["egress"].startswith("failed: egress by domain name is shut"), before
    assert "tasks with allow_domains fail; the others run" in before["egress"], before
    assert before["docker"] == "ok", before
    assert after["egress"] == "ok", after
