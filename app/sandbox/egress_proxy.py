"""The worker's side of egress by domain name: the proxy's container and one network per task.

A sandbox that may reach names (not CIDRs) sits on a Docker network of its own: internal
(no route out, no masquerading), a /28 carved from `ProxyPolicy.subnets`, whose only
other member is the proxy's container. The proxy (`app.egress`, copied into the
host directory `control_dir` and run from the sandbox image) is also on its own upstream
bridge and on no network of Postgres, Redis or the API. Host rules (iptables and
ip6tables) drop everything from the task bridges to the host itself (an internal
network's bridge still has the host's address on it) and every new connection from the
upstream bridge to the host; the host's own addresses and every Docker network's gateway
are refused destinations in each grant as well. A worker that does not install the rules
itself (`manage_firewall` off: compose's, in a container) starts no proxied sandbox unless
`app.sandbox.host_rules` confirms someone did on this boot, and refuses the host addresses
that marker lists too (its own /proc shows only its container's). The proxy learns each
task's allow-list and caps over a Unix socket (`control_dir/sock`), keyed by its own address
on that task's network, and tells the worker about refused connections
(`ProxyGate.on_blocked`); the worker keeps its live grants and sends them again when it
reconnects (a restarted proxy has none).
Imported by `app.sandbox.docker`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import logging
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiodocker
from aiodocker.exceptions import DockerError

from app import metrics
from app.config import Settings
from app.egress import rules
from app.errors import SandboxError
from app.sandbox import host_rules, network
from app.sandbox.egress_policy import PROXY_PORT, ProxyPolicy

PROXY_LABEL = "sandhive.egress-proxy"
TASK_NET_LABEL = "sandhive.egress-net"
BRIDGE_PREFIX = "shvp"
INPUT_CHAIN = "SHV-IN-proxied"
CONTAINER_DIR = "/run/sandhive-egress"
CODE_DIR = "/opt/sandhive"
CALL_TIMEOUT_S = 10.0
START_TIMEOUT_S = 20.0
NETWORK_TRIES = 8
SWEEP_AGE_S = 120.0
"""A task network is made moments before its sandbox: younger ones are never swept."""
RECONNECT_TRIES = 30
NOBODY = 65534
PROXY_SYSCTLS = {
    # It joins every task's network: it must never route between them (or out) ...
    "net.ipv4.ip_forward": "0",
    # ... nor answer ARP for one network's address on another, nor take spoofed sources.
    "net.ipv4.conf.all.arp_ignore": "1",
    "net.ipv4.conf.default.arp_ignore": "1",
    "net.ipv4.conf.all.arp_announce": "2",
    "net.ipv4.conf.default.arp_announce": "2",
    "net.ipv4.conf.all.rp_filter": "1",
    "net.ipv4.conf.default.rp_filter": "1",
    # No IPv6 on any of its interfaces: no link-local path around the IPv4 rules.
    "net.ipv6.conf.all.disable_ipv6": "1",
    "net.ipv6.conf.default.disable_ipv6": "1",
}
PACKAGE = Path(__file__).parents[1] / "egress"
log = logging.getLogger(__name__)

BlockedHook = Callable[[str, int, str, str], None]
"""(task id, attempt, host, reason) of one refused connection."""


@dataclass(frozen=True)
class TaskNetwork:
    """One task's private network and what its sandbox needs to use the proxy."""

    name: str
    key: str
    """The proxy's address on it: how the proxy tells this task's connections apart."""

    def env(self) -> dict[str, str]:
        url = f"http://{self.key}:{PROXY_PORT}"
        names = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
        return {**dict.fromkeys(names, url), "NO_PROXY": "", "no_proxy": ""}


def firewall_rules() -> str:
    """`ip(6)tables-restore --noflush` input: nothing from a per-task bridge reaches the host."""
    chain = INPUT_CHAIN
    return f"*filter\n:{chain} - [0:0]\n-A {chain} -i {BRIDGE_PREFIX}+ -j DROP\nCOMMIT\n"


def upstream_rule(bridge: str) -> list[str]:
    """The chain's rule for the upstream bridge: no new connection from it to the host (the
    proxy's answers to the host and its own connections out are not INPUT)."""
    return ["-i", bridge, "-m", "conntrack", "--ctstate", "NEW,INVALID", "-j", "DROP"]


def upstream_bridge(network_name: str) -> str:
    """The Linux bridge name the worker gives an upstream network it creates (<= 15 chars)."""
    return "shvo" + hashlib.sha256(network_name.encode()).hexdigest()[:10]


def bridge_of(info: dict[str, Any]) -> str:
    """The Linux bridge of a bridge network, from its inspect body (Docker's default name when
    none was given)."""
    named = (info.get("Options") or {}).get("com.docker.network.bridge.name")
    return str(named or f"br-{str(info['Id'])[:12]}")


def host_addresses(networks: list[dict[str, Any]]) -> list[str]:
    """Addresses of the Docker host a proxied connection must never reach: every Docker
    network's gateway (the host's side of each bridge) and the worker's own interface
    addresses (the host's, when the worker runs on it)."""
    found = {
        str(config["Gateway"]).split("/")[0]
        for net in networks
        for config in ((net.get("IPAM") or {}).get("Config") or [])
        if config.get("Gateway")
    }
    found.update(local_addresses())
    return sorted(found)


def local_addresses() -> set[str]:
    """This network namespace's own IPv4 and IPv6 addresses, read from /proc (no iproute2)."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        last = ""
        for line in Path("/proc/net/fib_trie").read_text().splitlines():
            if "|--" in line:
                last = line.split("|--")[1].strip()
            elif "/32 host LOCAL" in line and last:
                found.add(last)
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            found.add(str(ipaddress.IPv6Address(int(line.split()[0], 16))))
    return found


def pick_subnet(pool: str) -> ipaddress.IPv4Network:
    """A random /28 of the pool (the daemon refuses one already in use: then another)."""
    net = ipaddress.IPv4Network(pool)
    count = max(1, 2 ** (28 - net.prefixlen))
    start = int(net.network_address) + 16 * secrets.randbelow(count)
    return ipaddress.IPv4Network((start, 28))


class ProxyGate:
    """Per Docker host: the proxy container, the control channel, the per-task networks."""

    def __init__(self, api: Callable[[], aiodocker.Docker]) -> None:
        self._api = api
        self._lock = asyncio.Lock()
        self._writer: asyncio.StreamWriter | None = None
        self._listener: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = 0
        self._firewall = False
        self._grants: dict[str, dict[str, Any]] = {}
        """Live grants by key, sent again when the control channel is made anew."""
        self._policy: ProxyPolicy | None = None
        self._reconnect: asyncio.Task[None] | None = None
        self.on_blocked: BlockedHook | None = None

    async def open(
        self, policy: ProxyPolicy, allow: tuple[str, ...], labels: dict[str, str]
    ) -> TaskNetwork:
        """A task network with the proxy on it and the task's grant in place.

        The names are checked against the operator's ceiling as it is now (SandboxError
        naming those outside it): a task accepted before the ceiling narrowed gets nothing.
        """
        check_ceiling(policy, allow)
        marked = await self._ensure(policy)
        with _docker("list Docker networks"):
            refused = sorted({*host_addresses(await self._api().networks.list()), *marked})
        name, subnet = await self._create_network(policy, labels)
        key = str(subnet.network_address + 2)
        grant = {
            "op": "grant",
            "key": key,
            "subnet": str(subnet),
            "task": labels.get("sandhive.task", ""),
            "attempt": int(labels.get("sandhive.attempt", "0") or 0),
            "allow": list(allow),
            "max_connections": policy.max_connections,
            "max_bytes": policy.max_bytes,
            "max_open": policy.max_open,
            "max_refusals": policy.max_refusals,
            "ports": list(policy.ports),
            "exempt": list(policy.exempt),
            "service": [*policy.service, policy.subnets, *refused],
            "hosts": dict(policy.hosts),
        }
        try:
            with _docker(f"connect the egress proxy to {name}"):
                net = await self._api().networks.get(name)
                endpoint = {"IPAMConfig": {"IPv4Address": key}}
                await net.connect({"Container": policy.container, "EndpointConfig": endpoint})
            self._grants[key] = grant
            await self._call(grant)
        except BaseException:
            self._grants.pop(key, None)
            await self._drop_network(policy, name)
            raise
        return TaskNetwork(name, key)

    async def close(self, policy: ProxyPolicy, net: TaskNetwork) -> None:
        """Revoke the grant, take the proxy off the network, remove it (all best effort)."""
        self._grants.pop(net.key, None)
        with contextlib.suppress(SandboxError):
            await self._call({"op": "revoke", "key": net.key})
        await self._drop_network(policy, net.name)

    async def _drop_network(self, policy: ProxyPolicy, name: str) -> None:
        try:
            net = await self._api().networks.get(name)
            with contextlib.suppress(DockerError):
                await net.disconnect({"Container": policy.container, "Force": True})
            await net.delete()
        except DockerError as exc:
            if exc.status != 404:
                log.warning("could not remove egress network %s: %s", name, exc.message)

    async def _create_network(
        self, policy: ProxyPolicy, labels: dict[str, str]
    ) -> tuple[str, ipaddress.IPv4Network]:
        for _ in range(NETWORK_TRIES):
            subnet = pick_subnet(policy.subnets)
            tag = secrets.token_hex(5)
            config = {
                "Name": f"sandhive-egress-{tag}",
                "Driver": "bridge",
                "CheckDuplicate": True,
                "Internal": True,
                "EnableIPv6": False,
                "IPAM": {"Config": [{"Subnet": str(subnet), "Gateway": str(subnet[1])}]},
                "Options": {"com.docker.network.bridge.name": f"{BRIDGE_PREFIX}{tag}"},
                "Labels": {**labels, TASK_NET_LABEL: "1"},
            }
            try:
                await self._api().networks.create(config)
                return str(config["Name"]), subnet
            except DockerError as exc:
                if "overlap" not in exc.message and exc.status != 409:
                    raise SandboxError(f"create egress network: {exc.message}") from exc
        raise SandboxError(f"no free /28 left in {policy.subnets} for an egress network")

    async def _ensure(self, policy: ProxyPolicy) -> list[str]:
        """The proxy up and connected, the host rules in place (installed, or confirmed by
        their marker: its host addresses, which every grant refuses too)."""
        async with self._lock:
            self._policy = policy
            bridge = await _ensure_upstream(self._api(), policy.upstream_network)
            marked: list[str] = []
            if policy.manage_firewall:
                await _install_firewall(bridge, rebuild=not self._firewall)
                self._firewall = True
            else:  # checked before every task network: fail closed once the marker goes
                control = Path(policy.control_dir)
                marked = await asyncio.to_thread(host_rules.confirmed, control, bridge)
            if self._writer is not None and not self._writer.is_closing():
                return marked
            await self._ensure_container(policy)
            await self._connect(Path(policy.control_dir) / "sock" / "control.sock")
            for grant in list(self._grants.values()):  # a restarted proxy knows none of them
                try:
                    await self._call(grant)
                except SandboxError as exc:  # that task's egress stays shut: fail closed
                    log.warning("could not grant %s again: %s", grant["task"], exc)
            with contextlib.suppress(SandboxError, DockerError):
                await self.sweep(policy)
            return marked

    async def confirm_host_rules(self, policy: ProxyPolicy) -> None:
        """Readiness of a worker that does not install the host rules: SandboxError (why)
        unless their marker is of this boot and names the upstream network's bridge."""
        with _docker(f"inspect network {policy.upstream_network}"):
            bridge = bridge_of(
                await (await self._api().networks.get(policy.upstream_network)).show()
            )
        await asyncio.to_thread(host_rules.confirmed, Path(policy.control_dir), bridge)

    async def _reconnect_soon(self) -> None:
        """After the channel broke with grants live: make it again (the proxy restarts by
        its restart policy) so running tasks get their grants back without waiting for the
        next task to start."""
        for _ in range(RECONNECT_TRIES):
            await asyncio.sleep(1.0)
            if not self._grants or self._policy is None:
                return
            try:
                await self._ensure(self._policy)
                return
            except (SandboxError, DockerError, OSError, TimeoutError) as exc:
                log.warning("egress proxy reconnect failed: %r", exc)

    async def sweep(self, policy: ProxyPolicy, older_than_s: float = SWEEP_AGE_S) -> list[str]:
        """Remove task networks no sandbox is on any more (a worker died before removing its
        own); run when a worker (re)connects to the proxy. Names of those removed."""
        now = datetime.now(UTC)
        removed = []
        for listed in await self._api().networks.list(filters={"label": [f"{TASK_NET_LABEL}=1"]}):
            info = await (await self._api().networks.get(listed["Id"])).show()
            members = {c.get("Name") for c in (info.get("Containers") or {}).values()}
            created = datetime.fromisoformat(str(info["Created"])[:19]).replace(tzinfo=UTC)
            if members <= {policy.container} and (now - created).total_seconds() > older_than_s:
                await self._drop_network(policy, str(info["Name"]))
                removed.append(str(info["Name"]))
        return removed

    async def _ensure_container(self, policy: ProxyPolicy) -> None:
        with _docker("egress proxy container"):
            try:
                container = await self._api().containers.get(policy.container)
            except DockerError as exc:
                if exc.status != 404:
                    raise
                await asyncio.to_thread(_write_code, Path(policy.control_dir))
                container = await self._api().containers.create(
                    proxy_container(policy), name=policy.container
                )
            info = await container.show()
            if policy.upstream_network not in info["NetworkSettings"]["Networks"]:
                net = await self._api().networks.get(policy.upstream_network)
                await net.connect({"Container": policy.container})
            if not info["State"]["Running"]:
                await container.start()

    async def _connect(self, path: Path) -> None:
        async with asyncio.timeout(START_TIMEOUT_S):
            while True:
                try:
                    reader, self._writer = await asyncio.open_unix_connection(str(path))
                    break
                except OSError:
                    await asyncio.sleep(0.1)
        self._listener = asyncio.create_task(self._listen(reader), name="egress-proxy-control")

    async def _listen(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                msg = json.loads(line)
                if msg.get("event") == "blocked":
                    self._blocked(msg)
                elif (future := self._pending.pop(int(msg.get("id", -1)), None)) is not None:
                    future.set_result(msg)
        except (OSError, ValueError) as exc:
            log.warning("egress proxy control channel broke: %r", exc)
        finally:
            if self._writer is not None:
                self._writer.close()
            for future in self._pending.values():
                future.set_exception(SandboxError("the egress proxy went away"))
            self._pending.clear()
            if self._grants and (self._reconnect is None or self._reconnect.done()):
                self._reconnect = asyncio.create_task(self._reconnect_soon())

    def _blocked(self, msg: dict[str, Any]) -> None:
        metrics.EGRESS_BLOCKED.inc(max(1, int(msg.get("count", 1))))  # reports aggregate
        if self.on_blocked is not None and msg.get("task"):
            hook = self.on_blocked
            hook(str(msg["task"]), int(msg["attempt"]), str(msg["host"]), str(msg["reason"]))

    async def _call(self, msg: dict[str, Any]) -> None:
        writer = self._writer
        if writer is None or writer.is_closing():
            raise SandboxError("the egress proxy is not connected")
        self._ids += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[self._ids] = future
        writer.write(json.dumps({**msg, "id": self._ids}).encode() + b"\n")
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                await writer.drain()
                reply = await future
        except (OSError, TimeoutError) as exc:
            raise SandboxError(f"egress proxy did not answer {msg['op']}: {exc!r}") from exc
        if not reply.get("ok"):
            raise SandboxError(f"egress proxy refused {msg['op']}: {reply.get('error')}")

    async def aclose(self) -> None:
        self._grants.clear()
        if self._reconnect is not None:
            self._reconnect.cancel()
            await asyncio.gather(self._reconnect, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)


def check_ceiling(policy: ProxyPolicy, allow: tuple[str, ...]) -> None:
    """SandboxError naming the task's names the operator's ceiling no longer covers (the
    task fails with it as its error; nothing was created yet)."""
    if policy.ceiling is None:
        return
    wider = rules.outside_ceiling(allow, policy.ceiling)
    if wider:
        raise SandboxError(
            "allow_domains outside the server's egress ceiling (narrowed since the task was"
            f" accepted): {', '.join(wider)}",
            details={"outside": wider},
        )


def proxy_container(policy: ProxyPolicy) -> dict[str, Any]:
    """The proxy's create() body: no capabilities, read-only, small, on its upstream only;
    its file handles, memory, CPU and logs capped so no task can take it down for all."""
    root = Path(policy.control_dir)
    nofile = 2 * policy.max_open_total + 256  # a client and an upstream socket each
    command = ["python3", "-E", "-s", "-S", "-m", "egress"]  # no env, no site packages
    return {
        "Image": policy.image,
        "Cmd": [
            *command,
            "--control",
            f"{CONTAINER_DIR}/control.sock",
            "--max-open",
            str(policy.max_open_total),
        ],
        "WorkingDir": CODE_DIR,
        "Env": ["PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1", "PYTHONSAFEPATH="],
        "User": "{}:{}".format(*proxy_user()),
        "Labels": {PROXY_LABEL: "1"},
        "HostConfig": {
            "NetworkMode": policy.upstream_network,
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges"],
            "ReadonlyRootfs": True,
            "Init": True,
            "PidsLimit": 64,
            "Memory": 256 * 2**20,
            "MemorySwap": 256 * 2**20,  # no swap: the OOM kill (and restart) stays inside
            "NanoCpus": int(policy.cpus * 1e9),
            "Ulimits": [{"Name": "nofile", "Soft": nofile, "Hard": nofile}],
            "LogConfig": {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "3"}},
            "Tmpfs": {"/tmp": "rw,size=16m,nosuid,nodev,noexec"},
            "Mounts": [
                {"Type": "bind", "Source": f"{root}/code", "Target": CODE_DIR, "ReadOnly": True},
                {"Type": "bind", "Source": f"{root}/sock", "Target": CONTAINER_DIR},
            ],
            "RestartPolicy": {"Name": "unless-stopped"},
            "Sysctls": dict(PROXY_SYSCTLS),
        },
    }


def proxy_user() -> tuple[int, int]:
    """The proxy's uid and gid: never root. `nobody` when the worker is root (it hands the
    socket directory over, and still reaches the socket as root), else the worker's own (the
    directory is already its)."""
    if os.geteuid() == 0:
        return NOBODY, NOBODY
    return os.geteuid(), os.getegid()


def _write_code(root: Path) -> None:
    """The proxy's package into `root/code/egress` (what the container runs), `root/sock`
    (owned by the proxy's user, so it can make its socket there)."""
    (root / "sock").mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chown(root / "sock", *proxy_user())
    target = root / "code" / "egress"
    target.mkdir(parents=True, exist_ok=True, mode=0o755)
    for folder in (root / "code", target):
        folder.chmod(0o755)  # whatever the worker's umask: the proxy's user reads them
    for source in PACKAGE.glob("*.py"):
        shutil.copyfile(source, target / source.name)
        (target / source.name).chmod(0o644)


async def _ensure_upstream(api: aiodocker.Docker, name: str) -> str:
    """The upstream network, made when missing (with a bridge name of ours); its bridge."""
    try:
        return bridge_of(await (await api.networks.get(name)).show())
    except DockerError as exc:
        if exc.status != 404:
            raise SandboxError(f"inspect network {name}: {exc.message}") from exc
    config = {
        "Name": name,
        "Driver": "bridge",
        "EnableIPv6": False,
        "CheckDuplicate": True,
        "Options": {"com.docker.network.bridge.name": upstream_bridge(name)},
        "Labels": {PROXY_LABEL: "1"},
    }
    with contextlib.suppress(DockerError):  # another worker made it first
        await api.networks.create(config)
    with _docker(f"inspect network {name}"):
        return bridge_of(await (await api.networks.get(name)).show())


async def install_host_rules(policy: ProxyPolicy) -> str:
    """The host rules the worker installs itself when it may (`manage_firewall`), for a process
    on the Docker host's network with NET_ADMIN (compose's `egress-firewall` one-shot, whose
    worker cannot): the upstream network made when missing, both chains rebuilt for its bridge
    (IPv4 and IPv6), then the marker a worker that cannot check them wants (`host_rules`:
    this boot, the bridge, the host's addresses, read here in the host's namespace); removed
    first, so a failed run leaves none. Idempotent; the upstream bridge's name."""
    control = Path(policy.control_dir)
    await asyncio.to_thread(host_rules.remove_marker, control)
    try:
        api = aiodocker.Docker()
    except (ValueError, DockerError) as exc:
        raise SandboxError(f"cannot find a Docker daemon: {exc}") from exc
    try:
        bridge = await _ensure_upstream(api, policy.upstream_network)
    finally:
        await api.close()
    await _install_firewall(bridge, rebuild=True)
    addresses = sorted(local_addresses())
    await asyncio.to_thread(host_rules.write_marker, control, bridge, addresses)
    return bridge


async def _install_firewall(bridge: str, *, rebuild: bool) -> None:
    """The host rules (IPv4 and IPv6), built once per process; the jumps and the upstream
    bridge's rule checked before every task network."""
    for tool in ("iptables", "ip6tables"):
        if rebuild:
            await network.run_iptables(f"{tool}-restore", "--noflush", stdin=firewall_rules())
        rule = upstream_rule(bridge)
        if await network.run_iptables(tool, "-C", INPUT_CHAIN, *rule, check=False):
            await network.run_iptables(tool, "-A", INPUT_CHAIN, *rule)
        if await network.run_iptables(tool, "-C", "INPUT", "-j", INPUT_CHAIN, check=False):
            await network.run_iptables(tool, "-I", "INPUT", "1", "-j", INPUT_CHAIN)


@contextlib.contextmanager
def _docker(action: str) -> Any:
    try:
        yield
    except DockerError as exc:
        raise SandboxError(f"{action}: {exc.message}") from exc


def proxy_policy(settings: Settings) -> ProxyPolicy:
    """The operator's egress-by-name settings as the sandbox layer's policy."""
    s = settings
    hosts = tuple(
        (name.strip().lower(), address.strip())
        for name, _, address in (item.partition("=") for item in s.sandbox_egress_proxy_hosts)
    )
    return ProxyPolicy(
        image=s.sandbox_egress_proxy_image or s.sandbox_image,
        container=s.sandbox_egress_proxy_container,
        upstream_network=s.sandbox_egress_proxy_network,
        control_dir=str(s.sandbox_egress_proxy_dir),
        subnets=s.sandbox_egress_proxy_subnets,
        max_connections=s.sandbox_egress_proxy_max_connections,
        max_bytes=s.sandbox_egress_proxy_max_bytes,
        ports=tuple(s.sandbox_egress_proxy_ports),
        exempt=tuple(s.sandbox_egress_proxy_exempt),
        service=tuple(s.sandbox_egress_proxy_service),
        hosts=hosts,
        manage_firewall=s.sandbox_egress_firewall,
        ceiling=tuple(s.sandbox_egress_domains),
        max_open=s.sandbox_egress_proxy_max_open,
        max_open_total=s.sandbox_egress_proxy_max_open_total,
        max_refusals=s.sandbox_egress_proxy_max_refusals,
        cpus=s.sandbox_egress_proxy_cpus,
    )
