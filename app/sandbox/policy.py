"""Sandbox hardening policy: what a task's container may do, as a Docker create() body.

Pure (no Docker, no I/O) so it can be unit-tested and audited on its own.
`sandbox_config` is the one gate between a task's request and Docker: it checks
every tenant-chosen value against the server's `SandboxCaps` (allow-listed,
capped); `container_config` turns the result into the create() body with the
fixed defaults of RELIABILITY-SECURITY.md Part C1. Tenants never reach
`SecurityOpt`, `CapAdd`, `Privileged`, `Devices`, `Binds` or `NetworkMode`.
Imported by `app.sandbox.docker`, `app.sandbox.network` and whoever builds a
`SandboxConfig` (worker, `sandhive run`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from app import defaults
from app.sandbox.egress_policy import ProxyPolicy

MANAGED_LABEL = "sandhive.managed"
"""Every container Sandhive starts carries this label (invariant 4: it can always be found)."""
SANDBOX_LABEL = "sandhive.sandbox"
"""On a caller's own sandbox (`/v1/sandboxes`): its id; it has no task. `pool` on a warm one
(made before anyone asked), which keeps it once claimed: the worker logs which sandbox took
which warm container."""
WRITABLE_LABEL = "sandhive.writable_rootfs"
"""`1` on a caller's own sandbox whose image filesystem is writable: asked for, and allowed by
the operator (`SANDHIVE_SANDBOX_ALLOW_WRITABLE_ROOTFS`); visible in `docker inspect`."""

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/root/.local/bin"

BASE_ENV: Mapping[str, str] = MappingProxyType(
    {
        "PATH": SANDBOX_PATH,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_ROOT_USER_ACTION": "ignore",
        "PIP_NO_WARN_SCRIPT_LOCATION": "0",
        "LANG": "C.UTF-8",
    }
)
"""The reference runtime's environment (REFERENCE.md §1.5), never any service secret."""

READ_ONLY_ENV: Mapping[str, str] = MappingProxyType({"PIP_BREAK_SYSTEM_PACKAGES": "1"})
"""With a read-only image, pip falls back to the user site (/root/.local, a tmpfs); Debian's
PEP 668 marker would refuse even that, and nothing of the system can break: it is read-only."""

# Docker's default set keeps 14 capabilities; we drop all and add back only what root
# needs to manage its *own* files and processes inside the container:
#   CHOWN, FOWNER, FSETID   tar/pip/git/chmod on files whose owner differs (e.g. extracted archives)
#   DAC_OVERRIDE            root ignoring rwx bits (rm -rf of read-only git objects, 0444 files)
#   SETUID, SETGID          dropping to another user (su, apt's _apt sandbox, tests run as nobody)
#   KILL                    signalling processes of other uids started above
# Left out on purpose: NET_RAW (raw/packet sockets cross bridges even with ICC off), MKNOD,
# SYS_CHROOT, SETFCAP, SETPCAP, NET_BIND_SERVICE, AUDIT_WRITE. no-new-privileges stops
# setuid binaries from regaining any of them.
CAP_ADD: tuple[str, ...] = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")

NOFILE_LIMIT = 8192
"""Open files per process. Must not exceed the daemon's own hard limit: without
CAP_SYS_RESOURCE the container cannot raise it (this VM's dockerd has 20000)."""

SCRATCH_DIRS: Mapping[str, str] = MappingProxyType(
    {"/tmp": "1777", "/var/tmp": "1777", "/root": "700", "/run": "755"}
)
"""The writable directories besides the workdir (path: mode), each a size-capped tmpfs."""

INODES_PER_MB = 128
"""tmpfs inode cap per MiB of size: 1 GiB holds 131072 files (inodes cost kernel memory)."""

CA_BUNDLE_PATH = "/etc/sandhive/ca-bundle.crt"
CA_ENV_NAMES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
)

NETWORK_MODES = ("none", "egress")


@dataclass(frozen=True)
class EgressPolicy:
    """Where egress sandboxes go: one dedicated Docker network and its firewall."""

    network: str
    """Docker network name (ICC off, masquerading on, IPv4 only)."""
    bridge: str
    """Its Linux bridge, which the iptables rules match."""
    allow: tuple[str, ...] = ()
    """CIDRs that may be reached; empty: any public address. Never implicit: host, private."""
    manage_firewall: bool = True
    """Install the iptables rules from this process (else the operator did)."""
    proxy: ProxyPolicy | None = None
    """Set: egress is by domain name, through the filtering proxy only (`network` and
    `allow` then unused: each sandbox gets a network of its own)."""


@dataclass(frozen=True)
class SandboxCaps:
    """The server's side of the policy: the allow-list and caps tenants choose within."""

    image: str
    max_cpus: float
    max_memory_mb: int
    max_disk_mb: int
    pids_limit: int = defaults.PIDS_LIMIT
    scratch_mb: int = defaults.SCRATCH_MB
    read_only_rootfs: bool = True
    egress: EgressPolicy | None = None
    """None: `egress` is refused."""
    ca_bundle: str | None = None
    """Host path of an extra CA bundle for egress sandboxes (read-only bind mount)."""
    runtime: str = defaults.SANDBOX_RUNTIME
    """The OCI runtime dockerd starts sandboxes with (`runc`, or `crun`: same isolation)."""


@dataclass(frozen=True)
class SandboxConfig:
    """Everything that varies between two sandboxes; the rest is fixed policy."""

    image: str
    labels: Mapping[str, str]
    cpus: float = defaults.CPUS
    memory_mb: int = defaults.MEMORY_MB
    disk_mb: int = defaults.DISK_MB
    """Size of the workdir (a tmpfs volume); added to the memory limit, since it is RAM."""
    scratch_mb: int = defaults.SCRATCH_MB
    pids_limit: int = defaults.PIDS_LIMIT
    network: str = "none"
    egress: EgressPolicy | None = None
    read_only_rootfs: bool = True
    ca_bundle: str | None = None
    workdir: str = defaults.WORKDIR
    env: Mapping[str, str] = field(default_factory=dict)
    allow_domains: tuple[str, ...] = ()
    """Names (`*.suffix` too) the egress proxy lets this sandbox reach; proxied egress only."""
    output_cap_bytes: int = 16 * 2**20
    """Per stream and per exec: beyond it only the head and tail halves are kept in memory."""
    runtime: str = defaults.SANDBOX_RUNTIME
    """OCI runtime name as registered with dockerd; the server's choice, never a tenant's."""
    workdir_on_disk: bool = False
    """The workdir as a plain volume on the Docker host's disk instead of a size-capped tmpfs:
    a directory then lists in the host file system's order (ext4: hash order), as the
    package's container does, where a tmpfs lists newest first. Not capped by `disk_mb`."""
    extra_scratch: tuple[str, ...] = ()
    """More writable tmpfs directories, as the scratch ones (a verified task's /tests, /logs)."""
    deadline_s: float = defaults.SANDBOX_DEADLINE_S
    """Seconds from its start after which the container ends and Docker removes it (and its
    workdir volume) by itself, whether or not any worker is left to do it. Fixed at creation:
    it must be past anything its task may still do (the task's timeout plus graces)."""

    def __post_init__(self) -> None:
        if self.network not in NETWORK_MODES:
            raise ValueError(f"unsupported sandbox network {self.network!r}: {NETWORK_MODES}")
        if self.network == "egress" and self.egress is None:
            raise ValueError("network 'egress' needs an egress policy (is egress enabled?)")
        if self.cpus <= 0 or self.memory_mb < 16 or self.pids_limit < 1:
            raise ValueError("cpus, memory_mb and pids_limit must be positive")
        if self.disk_mb < 1 or self.scratch_mb < 1:
            raise ValueError("disk_mb and scratch_mb must be positive")
        if not self.workdir.startswith("/") or self.workdir.rstrip("/") in ("", *SCRATCH_DIRS):
            raise ValueError(f"workdir must be absolute, not a scratch dir: {self.workdir!r}")
        if any(not k or "=" in k or "\0" in k for k in self.env):
            raise ValueError("environment variable names must be non-empty, without '=' or NUL")
        if self.ca_bundle is not None and not self.ca_bundle.startswith("/"):
            raise ValueError("ca_bundle must be an absolute host path")
        if self.output_cap_bytes < 2:
            raise ValueError("output_cap_bytes must be at least 2")
        if not 0 < self.deadline_s < math.inf:
            raise ValueError(f"deadline_s must be positive and finite, got {self.deadline_s}")


def sandbox_config(
    caps: SandboxCaps,
    *,
    labels: Mapping[str, str],
    cpus: float,
    memory_mb: int,
    disk_mb: int,
    network: str,
    workdir: str = defaults.WORKDIR,
    deadline_s: float = defaults.SANDBOX_DEADLINE_S,
    allow_domains: tuple[str, ...] = (),
    workdir_on_disk: bool = False,
    extra_scratch: tuple[str, ...] = (),
) -> SandboxConfig:
    """A task's sandbox request checked against the server's caps; ValueError when it exceeds them.

    The API already refused such requests (422); this is the worker's own check that no
    task field reaches Docker without passing the allow-list (RELIABILITY §0, link 4).
    """
    if not 0 < cpus <= caps.max_cpus:
        raise ValueError(f"cpus {cpus} outside (0, {caps.max_cpus}]")
    if not 16 <= memory_mb <= caps.max_memory_mb:
        raise ValueError(f"memory_mb {memory_mb} outside [16, {caps.max_memory_mb}]")
    if not 1 <= disk_mb <= caps.max_disk_mb:
        raise ValueError(f"disk_mb {disk_mb} outside [1, {caps.max_disk_mb}]")
    if network == "egress" and caps.egress is None:
        raise ValueError("network 'egress' is not enabled on this server")
    egress = caps.egress if network == "egress" else None
    if allow_domains and (egress is None or egress.proxy is None):
        raise ValueError("allow_domains needs network 'egress' by domain name (the proxy)")
    return SandboxConfig(
        image=caps.image,
        labels=labels,
        cpus=cpus,
        memory_mb=memory_mb,
        disk_mb=disk_mb,
        scratch_mb=caps.scratch_mb,
        pids_limit=caps.pids_limit,
        network=network,
        egress=egress,
        read_only_rootfs=caps.read_only_rootfs,
        ca_bundle=caps.ca_bundle if egress is not None else None,
        workdir=workdir,
        allow_domains=allow_domains,
        runtime=caps.runtime,
        deadline_s=deadline_s,
        workdir_on_disk=workdir_on_disk,
        extra_scratch=extra_scratch,
    )


def container_env(cfg: SandboxConfig) -> list[str]:
    """The container's environment: the reference's base, the policy's, then the task's extras."""
    merged = {**BASE_ENV}
    if cfg.read_only_rootfs:
        merged.update(READ_ONLY_ENV)
    if _mounts_ca(cfg):
        merged.update(dict.fromkeys(CA_ENV_NAMES, CA_BUNDLE_PATH))
    merged.update(cfg.env)
    return [f"{key}={value}" for key, value in merged.items()]


def _mounts_ca(cfg: SandboxConfig) -> bool:
    return cfg.ca_bundle is not None and cfg.network == "egress"


def _tmpfs_options(size_mb: int, mode: str | None = None) -> str:
    inodes = max(size_mb * INODES_PER_MB, 4096)
    options = f"size={size_mb}m,nr_inodes={inodes},nosuid,nodev"
    return f"{options},mode={mode}" if mode else options


def container_mounts(cfg: SandboxConfig) -> list[dict[str, Any]]:
    """The workdir as a size-capped tmpfs volume (removed with the container) and the CA bundle.

    A volume rather than a plain tmpfs mount because Docker's archive API (our only way
    in and out) sees volumes but not tmpfs mounts; the local driver mounts it on demand.
    With `workdir_on_disk` the volume is the local driver's plain directory on the host.
    """
    tmpfs = {"type": "tmpfs", "device": "tmpfs", "o": _tmpfs_options(cfg.disk_mb)}
    workdir = {
        "Type": "volume",
        "Target": cfg.workdir,
        "VolumeOptions": {
            "NoCopy": True,
            "Labels": {**cfg.labels, MANAGED_LABEL: "1"},
            "DriverConfig": {"Name": "local", "Options": {} if cfg.workdir_on_disk else tmpfs},
        },
    }
    mounts: list[dict[str, Any]] = [workdir]
    if _mounts_ca(cfg):
        mounts.append(
            {"Type": "bind", "Source": cfg.ca_bundle, "Target": CA_BUNDLE_PATH, "ReadOnly": True}
        )
    return mounts


def main_command(deadline_s: float) -> list[str]:
    """PID 1's child, whose end stops the container: a `sleep` as long as the sandbox may live.

    Whole seconds, rounded up (never shorter than asked). Its end is the sandbox's deadline,
    kept by the kernel and Docker (with `AutoRemove`), not by any worker.
    """
    return ["sleep", str(math.ceil(deadline_s))]


def container_config(cfg: SandboxConfig) -> dict[str, Any]:
    """The aiodocker create() body: hardened defaults (ARCHITECTURE.md, RELIABILITY C1 and I-09)."""
    memory = (cfg.memory_mb + cfg.disk_mb) * 2**20
    network = cfg.egress.network if cfg.egress is not None and cfg.network == "egress" else "none"
    return {
        "Image": cfg.image,
        "Cmd": main_command(cfg.deadline_s),
        "WorkingDir": cfg.workdir,
        "Env": container_env(cfg),
        "Labels": {**cfg.labels, MANAGED_LABEL: "1"},
        "User": "",  # root, like the reference: see CAP_ADD for what that root may still do
        "Tty": False,
        "OpenStdin": False,
        "AttachStdin": False,
        "AttachStdout": False,
        "AttachStderr": False,
        "HostConfig": {
            "NetworkMode": network,
            "Runtime": cfg.runtime,
            "CapDrop": ["ALL"],
            "CapAdd": list(CAP_ADD),
            "SecurityOpt": ["no-new-privileges"],
            "Privileged": False,
            "Init": True,  # tini as PID 1 reaps the zombies of every exec
            "PidsLimit": cfg.pids_limit,
            "Memory": memory,
            "MemorySwap": memory,  # equal to Memory: no swap, the OOM kill stays inside
            "NanoCpus": int(cfg.cpus * 1e9),
            "OomKillDisable": False,
            "Ulimits": [
                {"Name": "nofile", "Soft": NOFILE_LIMIT, "Hard": NOFILE_LIMIT},
                {"Name": "core", "Soft": 0, "Hard": 0},
            ],
            "IpcMode": "private",
            "CgroupnsMode": "private",  # its own cgroup is its root: no host cgroup paths
            "ReadonlyRootfs": cfg.read_only_rootfs,
            "Tmpfs": {
                path: f"rw,exec,{_tmpfs_options(cfg.scratch_mb, mode)}"
                for path, mode in {
                    **SCRATCH_DIRS,
                    **dict.fromkeys(cfg.extra_scratch, "755"),
                }.items()
            },
            "Binds": [],
            "Mounts": container_mounts(cfg),
            "Devices": [],
            "PortBindings": {},
            "PublishAllPorts": False,
            "RestartPolicy": {"Name": "no"},
            # Once the main command ends (its deadline), the daemon removes the container and
            # its anonymous volumes (the workdir) itself: nothing is left if no worker returns.
            "AutoRemove": True,
            "LogConfig": {"Type": "none", "Config": {}},  # PID 1 is `sleep`; nothing to keep
            **_proxied_sysctls(cfg),
        },
    }


def _proxied_sysctls(cfg: SandboxConfig) -> dict[str, Any]:
    """No IPv6 at all in a sandbox whose one way out is the proxy: its network has none, and
    a link-local fe80:: path to the host or the proxy would skirt the IPv4 rules."""
    if cfg.network != "egress" or cfg.egress is None or cfg.egress.proxy is None:
        return {}
    off = {f"net.ipv6.conf.{which}.disable_ipv6": "1" for which in ("all", "default")}
    return {"Sysctls": off}
