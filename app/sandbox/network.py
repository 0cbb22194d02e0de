"""The egress network: one dedicated Docker bridge for `egress` sandboxes, and its firewall.

The network has inter-container traffic off (ICC), IPv4 only, masquerading on.
The firewall (iptables, in chains of our own jumped to from `DOCKER-USER` and
`INPUT`) lets a sandbox reach the public Internet, or only the allow-listed
CIDRs, and never: another sandbox, the host itself (the gateway and every host
address: Postgres, Redis, the API, the Docker daemon), private, link-local,
CGNAT or multicast ranges. Rules are rebuilt atomically (`iptables-restore`).

`firewall_rules` is pure and unit-tested; the rest needs root on the Docker
host (the worker's host). Imported by `app.sandbox.docker` and by tests.
"""

from __future__ import annotations

import asyncio
import ipaddress

import aiodocker
from aiodocker.exceptions import DockerError

from app.errors import SandboxError
from app.sandbox.policy import EgressPolicy

EGRESS_LABEL = "sandhive.egress"
IPTABLES_WAIT_S = "10"
IPTABLES_TIMEOUT_S = 30.0

BLOCKED_V4: tuple[str, ...] = (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # RFC 1918
    "100.64.0.0/10",  # CGNAT
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link-local, cloud metadata services
    "172.16.0.0/12",  # RFC 1918 (Docker's own bridges live here)
    "192.0.0.0/24",  # IETF protocol assignments
    "192.168.0.0/16",  # RFC 1918
    "198.18.0.0/15",  # benchmarking
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, broadcast
)
"""Never reachable from an egress sandbox unless a CIDR of the allow-list says so."""


def chain_names(bridge: str) -> tuple[str, str]:
    """(forward chain, input chain) of one egress bridge; iptables allows 28 characters."""
    return f"SHV-FWD-{bridge}", f"SHV-IN-{bridge}"


def normalize_allow(allow: tuple[str, ...]) -> tuple[str, ...]:
    """The allow-list as canonical IPv4 CIDRs; ValueError for anything else."""
    networks = []
    for item in allow:
        net = ipaddress.ip_network(item.strip(), strict=False)
        if net.version != 4:
            raise ValueError(f"egress allow-list: only IPv4 CIDRs, got {item!r}")
        networks.append(str(net))
    return tuple(networks)


def firewall_rules(policy: EgressPolicy) -> str:
    """The `iptables-restore --noflush` input that (re)builds both chains of this bridge."""
    fwd, inp = chain_names(policy.bridge)
    br = policy.bridge
    allow = normalize_allow(policy.allow)
    lines = [
        "*filter",
        f":{fwd} - [0:0]",
        f":{inp} - [0:0]",
        # Replies to connections a sandbox opened (needed when an allowed target sits on
        # another Docker bridge, whose isolation chain would drop them).
        f"-A {fwd} -o {br} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        f"-A {fwd} -i {br} -o {br} -j DROP",  # sandbox to sandbox (ICC off is the first guard)
        *(f"-A {fwd} -i {br} -d {cidr} -j ACCEPT" for cidr in allow),
        *(f"-A {fwd} -i {br} -d {cidr} -j DROP" for cidr in BLOCKED_V4),
        *([f"-A {fwd} -i {br} -j DROP"] if allow else []),  # an allow-list allows only itself
        f"-A {fwd} -j RETURN",
        # The host's own addresses (gateway, eth0, docker0 ...) are INPUT, not FORWARD.
        *(f"-A {inp} -i {br} -d {cidr} -j ACCEPT" for cidr in allow),
        f"-A {inp} -i {br} -j DROP",
        "COMMIT",
        "",
    ]
    return "\n".join(lines)


async def ensure_network(docker: aiodocker.Docker, policy: EgressPolicy) -> None:
    """Create the egress network if missing; refuse an existing one that is not set up as ours."""
    try:
        info = await _inspect(docker, policy.network)
    except DockerError as exc:
        if exc.status != 404:
            raise SandboxError(f"inspect network {policy.network}: {exc.message}") from exc
        info = await _create(docker, policy)
    _check_network(info, policy)


async def _inspect(docker: aiodocker.Docker, name: str) -> dict[str, object]:
    network = await docker.networks.get(name)
    info: dict[str, object] = await network.show()
    return info


async def _create(docker: aiodocker.Docker, policy: EgressPolicy) -> dict[str, object]:
    config = {
        "Name": policy.network,
        "Driver": "bridge",
        "CheckDuplicate": True,
        "EnableIPv6": False,
        "Internal": False,
        "Attachable": False,
        "Options": {
            "com.docker.network.bridge.name": policy.bridge,
            "com.docker.network.bridge.enable_icc": "false",
            "com.docker.network.bridge.enable_ip_masquerade": "true",
        },
        "Labels": {EGRESS_LABEL: "1"},
    }
    try:
        await docker.networks.create(config)
    except DockerError as exc:
        if exc.status != 409:  # another worker created it first: fine
            raise SandboxError(f"create network {policy.network}: {exc.message}") from exc
    try:
        return await _inspect(docker, policy.network)
    except DockerError as exc:
        raise SandboxError(f"inspect network {policy.network}: {exc.message}") from exc


def _check_network(info: dict[str, object], policy: EgressPolicy) -> None:
    options = info.get("Options")
    if not isinstance(options, dict):
        options = {}
    wrong = []
    if info.get("Driver") != "bridge":
        wrong.append(f"driver {info.get('Driver')!r}")
    if options.get("com.docker.network.bridge.enable_icc") != "false":
        wrong.append("inter-container traffic is on")
    if options.get("com.docker.network.bridge.name") != policy.bridge:
        wrong.append(f"bridge is not {policy.bridge!r}")
    if info.get("EnableIPv6"):
        wrong.append("IPv6 is on")
    if wrong:
        raise SandboxError(
            f"Docker network {policy.network!r} exists but is not a Sandhive egress network: "
            f"{', '.join(wrong)}; remove it or choose another SANDHIVE_SANDBOX_EGRESS_NETWORK"
        )


async def install_firewall(policy: EgressPolicy) -> None:
    """(Re)build the bridge's chains atomically and make sure DOCKER-USER and INPUT jump to them."""
    try:
        rules = firewall_rules(policy)
    except ValueError as exc:
        raise SandboxError(str(exc)) from exc
    await _iptables("iptables-restore", "-w", IPTABLES_WAIT_S, "--noflush", stdin=rules)
    for parent, chain in _jumps(policy):
        if not await _has_jump(parent, chain):
            await _iptables("iptables", "-w", IPTABLES_WAIT_S, "-I", parent, "1", "-j", chain)


async def firewall_installed(policy: EgressPolicy) -> bool:
    """Both jumps are in place (a cheap check before each egress sandbox)."""
    for parent, chain in _jumps(policy):
        if not await _has_jump(parent, chain):
            return False
    return True


async def remove_firewall(policy: EgressPolicy) -> None:
    """Undo `install_firewall` (tests, and operators retiring egress)."""
    for parent, chain in _jumps(policy):
        while await _has_jump(parent, chain):
            await _iptables("iptables", "-w", IPTABLES_WAIT_S, "-D", parent, "-j", chain)
    for _parent, chain in _jumps(policy):
        for action in ("-F", "-X"):
            await _iptables("iptables", "-w", IPTABLES_WAIT_S, action, chain, check=False)


async def run_iptables(*argv: str, stdin: str | None = None, check: bool = True) -> int:
    """One iptables(-restore) command, waiting for the xtables lock (`app.sandbox.egress_proxy`)."""
    return await _iptables(argv[0], "-w", IPTABLES_WAIT_S, *argv[1:], stdin=stdin, check=check)


def _jumps(policy: EgressPolicy) -> tuple[tuple[str, str], tuple[str, str]]:
    fwd, inp = chain_names(policy.bridge)
    return ("DOCKER-USER", fwd), ("INPUT", inp)


async def _has_jump(parent: str, chain: str) -> bool:
    code = await _iptables(
        "iptables", "-w", IPTABLES_WAIT_S, "-C", parent, "-j", chain, check=False
    )
    return code == 0


async def _iptables(*argv: str, stdin: str | None = None, check: bool = True) -> int:
    """Run one iptables command; SandboxError (fail closed) when it cannot be run or fails."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        raise SandboxError(f"egress firewall: cannot run {argv[0]}: {exc!r}") from exc
    try:
        async with asyncio.timeout(IPTABLES_TIMEOUT_S):
            _, err = await proc.communicate(stdin.encode() if stdin is not None else None)
    except TimeoutError as exc:
        proc.kill()
        await proc.wait()
        raise SandboxError(f"egress firewall: {argv[0]} did not finish") from exc
    code = proc.returncode if proc.returncode is not None else -1
    if check and code != 0:
        detail = err.decode(errors="replace").strip()[-500:]
        raise SandboxError(f"egress firewall: {' '.join(argv[:4])} failed ({code}): {detail}")
    return code
