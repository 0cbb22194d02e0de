"""Sandbox hardening policy: what a task's container may do, as a Docker create() body.

Pure (no Docker, no I/O) so it can be unit-tested and audited on its own.
Imported by `app.sandbox.docker` and by whoever builds a `SandboxConfig` (worker, cli).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

MANAGED_LABEL = "sandhive.managed"
"""Every container Sandhive starts carries this label (invariant 4: it can always be found)."""

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


@dataclass(frozen=True)
class SandboxConfig:
    """Everything that varies between two sandboxes; the rest is fixed policy."""

    image: str
    labels: Mapping[str, str]
    cpus: float = 1.0
    memory_mb: int = 1024
    pids_limit: int = 512
    network: str = "none"
    workdir: str = "/testbed"
    env: Mapping[str, str] = field(default_factory=dict)
    output_cap_bytes: int = 16 * 2**20
    """Per stream and per exec: beyond it only the head and tail halves are kept in memory."""

    def __post_init__(self) -> None:
        if self.network != "none":
            raise ValueError(f"unsupported sandbox network {self.network!r}; only 'none'")
        if self.cpus <= 0 or self.memory_mb < 16 or self.pids_limit < 1:
            raise ValueError("cpus, memory_mb and pids_limit must be positive")
        if not self.workdir.startswith("/"):
            raise ValueError(f"workdir must be absolute, got {self.workdir!r}")
        if any(not k or "=" in k or "\0" in k for k in self.env):
            raise ValueError("environment variable names must be non-empty, without '=' or NUL")
        if self.output_cap_bytes < 2:
            raise ValueError("output_cap_bytes must be at least 2")


def container_env(cfg: SandboxConfig) -> list[str]:
    """The container's environment: the reference's base, then the task's extras."""
    merged = {**BASE_ENV, **cfg.env}
    return [f"{key}={value}" for key, value in merged.items()]


def container_config(cfg: SandboxConfig) -> dict[str, Any]:
    """The aiodocker create() body: hardened defaults (ARCHITECTURE.md, RELIABILITY I-09)."""
    memory = cfg.memory_mb * 2**20
    return {
        "Image": cfg.image,
        "Cmd": ["sleep", "infinity"],
        "WorkingDir": cfg.workdir,
        "Env": container_env(cfg),
        "Labels": {**cfg.labels, MANAGED_LABEL: "1"},
        "User": "",  # root, like the reference: the agent pip-installs into the system
        "Tty": False,
        "OpenStdin": False,
        "AttachStdin": False,
        "AttachStdout": False,
        "AttachStderr": False,
        "HostConfig": {
            "NetworkMode": cfg.network,
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
            "ReadonlyRootfs": False,
            "Binds": [],
            "Mounts": [],
            "Devices": [],
            "PublishAllPorts": False,
            "RestartPolicy": {"Name": "no"},
            "LogConfig": {"Type": "none", "Config": {}},  # PID 1 is `sleep`; nothing to keep
        },
    }
