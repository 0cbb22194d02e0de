"""The sandbox container audit (RELIABILITY I-09, our subset of CIS section 5).

`audit(inspect)` lists what is wrong with one `docker inspect` document;
`SandboxAuditor` watches `docker events` for the whole test session and audits
every container Sandhive starts (name `sandhive-<12 hex>`, label
`sandhive.managed=1`), so no test can start a weaker one unnoticed.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from app.sandbox.policy import CA_BUNDLE_PATH, CAP_ADD, MANAGED_LABEL, SANDBOX_LABEL, WRITABLE_LABEL
from app.sandbox.python_scorer.score import SCORER_LABEL
from app.sandbox.reaper import (
    ATTEMPT_LABEL,
    CREATED_LABEL,
    INSTANCE_LABEL,
    POOL_LABEL,
    TASK_LABEL,
    WORKER_LABEL,
)

SANDBOX_NAME = re.compile(r"^/?sandhive-[0-9a-f]{12}$")
MAX_PIDS = 4096
FORBIDDEN_SECURITY = ("seccomp=unconfined", "apparmor=unconfined", "label=disable")
OUTSIDE_A_DEPLOYMENT = frozenset({"sandhive.local", "sandhive.bench", "sandhive.test"})
"""Labels of sandboxes no worker made: `sandhive local`, bench/overhead.py, sandbox-layer tests."""


def audit(info: dict[str, Any]) -> list[str]:
    """Every violation of the sandbox policy in one container's inspect document."""
    hc = info.get("HostConfig") or {}
    config = info.get("Config") or {}
    problems = [
        *_privileges(hc),
        *_resources(hc),
        *_namespaces(hc),
        *_network(hc),
        *_mounts(hc, info.get("Mounts") or []),
    ]
    labels = config.get("Labels") or {}
    if hc.get("ReadonlyRootfs") is not True and not _writable_by_choice(labels):
        problems.append("the image filesystem is writable")
    if hc.get("Init") is not True:
        problems.append("no init process")
    if (hc.get("RestartPolicy") or {}).get("Name") not in ("no", ""):
        problems.append(f"restart policy {hc.get('RestartPolicy')}")
    if (hc.get("LogConfig") or {}).get("Type") not in ("none", "local"):
        problems.append(f"log driver {(hc.get('LogConfig') or {}).get('Type')!r} does not rotate")
    return problems + _labels(labels)


def _writable_by_choice(labels: dict[str, str]) -> bool:
    """A `/v1/sandboxes` sandbox whose caller asked for a writable image filesystem, on a
    server whose operator allows it (SANDHIVE_SANDBOX_ALLOW_WRITABLE_ROOTFS): labelled so."""
    return bool(labels.get(SANDBOX_LABEL)) and labels.get(WRITABLE_LABEL) == "1"


def _labels(labels: dict[str, str]) -> list[str]:
    """What the reaper and an operator need to tell whose a sandbox is (C1.8).

    A task sandbox (made by a worker) carries the instance, task, attempt, worker and
    creation time; a warm-pool one the instance and worker (its task is not known when it
    is made), and so does a python scorer's, with its creation time; `sandhive local`,
    the overhead bench and the sandbox-layer tests make sandboxes outside any deployment and
    mark them so instead.
    """
    if labels.get(MANAGED_LABEL) != "1":
        return ["no sandhive.managed label"]
    if labels.keys() & OUTSIDE_A_DEPLOYMENT:
        return []
    required: tuple[str, ...]
    if labels.get(POOL_LABEL) == "1":
        required = (INSTANCE_LABEL, WORKER_LABEL)
    elif labels.get(SCORER_LABEL) == "python":  # one answer's scorer: no task, its own deadline
        required = (INSTANCE_LABEL, WORKER_LABEL, CREATED_LABEL)
    elif labels.get("sandhive.episode"):  # an RL episode's (app.worker.episodes.live): no task
        required = (INSTANCE_LABEL, WORKER_LABEL, CREATED_LABEL)
    elif labels.get(SANDBOX_LABEL):  # a caller's own (app.worker.sandboxes): no task
        required = (INSTANCE_LABEL, WORKER_LABEL, CREATED_LABEL)
    else:
        required = (INSTANCE_LABEL, TASK_LABEL, ATTEMPT_LABEL, WORKER_LABEL, CREATED_LABEL)
    problems = [f"no {key} label" for key in required if not labels.get(key)]
    attempt = labels.get(ATTEMPT_LABEL)
    if attempt is not None and not (attempt.isdigit() and int(attempt) >= 1):
        problems.append(f"{ATTEMPT_LABEL} {attempt!r} is not an attempt number")
    created = labels.get(CREATED_LABEL)
    if created:
        try:
            datetime.fromisoformat(created)
        except ValueError:
            problems.append(f"{CREATED_LABEL} {created!r} is not an ISO 8601 time")
    return problems


def audit_lifetime(info: dict[str, Any]) -> list[str]:
    """What keeps a sandbox from ending by itself at its deadline, Docker then removing it
    (with its workdir volume), so that none outlives its task for good when no worker comes
    back. Not part of `audit`, which the session-wide watcher runs on every Sandhive
    container of the host: sandboxes of older checkouts (other sessions) have no deadline."""
    hc = info.get("HostConfig") or {}
    config = info.get("Config") or {}
    problems = []
    if hc.get("AutoRemove") is not True:
        problems.append("no AutoRemove: an ended sandbox would stay")
    cmd = config.get("Cmd") or []
    if not (len(cmd) == 2 and cmd[0] == "sleep" and _positive_finite(cmd[1])):
        problems.append(f"no deadline: the main command {cmd} is not `sleep <seconds>`")
    return problems


def _positive_finite(text: str) -> bool:
    try:
        return 0 < float(text) < math.inf
    except ValueError:
        return False


def _privileges(hc: dict[str, Any]) -> list[str]:
    problems = []
    if hc.get("Privileged"):
        problems.append("privileged")
    if hc.get("CapDrop") != ["ALL"]:
        problems.append(f"CapDrop is {hc.get('CapDrop')}, not ['ALL']")
    extra = set(hc.get("CapAdd") or []) - set(CAP_ADD)
    if extra:
        problems.append(f"capabilities beyond the allow-list: {sorted(extra)}")
    security = hc.get("SecurityOpt") or []
    if "no-new-privileges" not in security and "no-new-privileges:true" not in security:
        problems.append("no no-new-privileges")
    problems += [f"SecurityOpt {opt}" for opt in security if opt in FORBIDDEN_SECURITY]
    return problems


def _resources(hc: dict[str, Any]) -> list[str]:
    problems = []
    pids = hc.get("PidsLimit") or 0
    if not 0 < pids <= MAX_PIDS:
        problems.append(f"PidsLimit {pids}")
    if not hc.get("Memory") or hc.get("MemorySwap") != hc.get("Memory"):
        problems.append(f"Memory {hc.get('Memory')} / MemorySwap {hc.get('MemorySwap')}")
    if not hc.get("NanoCpus"):
        problems.append("no CPU quota")
    if not hc.get("Ulimits"):
        problems.append("no ulimits")
    if hc.get("OomKillDisable"):
        problems.append("OOM killer disabled")
    if hc.get("Devices"):
        problems.append(f"devices {hc.get('Devices')}")
    return problems


def _namespaces(hc: dict[str, Any]) -> list[str]:
    problems = []
    if hc.get("IpcMode") != "private":
        problems.append(f"IpcMode {hc.get('IpcMode')!r}")
    for key in ("PidMode", "UTSMode", "UsernsMode", "CgroupnsMode"):
        if hc.get(key) == "host":
            problems.append(f"{key} host")
    return problems


def _network(hc: dict[str, Any]) -> list[str]:
    problems = []
    mode = hc.get("NetworkMode") or ""
    if mode in ("host", "bridge", "default") or mode.startswith("container:"):
        problems.append(f"NetworkMode {mode!r}")
    if any(hc.get("PortBindings") or {}):
        problems.append(f"published ports {hc.get('PortBindings')}")
    if hc.get("PublishAllPorts"):
        problems.append("PublishAllPorts")
    return problems


def _mounts(hc: dict[str, Any], mounts: list[dict[str, Any]]) -> list[str]:
    problems = []
    if hc.get("Binds"):
        problems.append(f"bind mounts {hc.get('Binds')}")
    for mount in mounts:
        source = str(mount.get("Source", ""))
        if "docker.sock" in source or "containerd" in source:
            problems.append(f"the Docker control plane is mounted: {source}")
        elif mount.get("Type") == "bind" and (
            mount.get("Destination") != CA_BUNDLE_PATH or mount.get("RW")
        ):
            problems.append(f"bind mount {source} -> {mount.get('Destination')}")
        elif mount.get("Type") not in ("bind", "volume", "tmpfs"):
            problems.append(f"mount of type {mount.get('Type')}")
    return problems


@dataclass
class SandboxAuditor:
    """Audits each Sandhive container as it starts, for as long as it runs."""

    audited: list[str] = field(default_factory=list)
    violations: dict[str, list[str]] = field(default_factory=dict)
    missed: int = 0
    """Containers gone before they could be inspected (none of their settings unseen, though:
    every sandbox is made by the same `container_config`)."""
    _proc: subprocess.Popen[str] | None = None
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [
                "docker",
                "events",
                "--format",
                "{{json .}}",
                "--filter",
                "type=container",
                "--filter",
                "event=start",
                "--filter",
                f"label={MANAGED_LABEL}=1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        assert self._proc is not None
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            name = (event.get("Actor") or {}).get("Attributes", {}).get("name", "")
            if SANDBOX_NAME.match(name):
                self.check(event.get("id") or event["Actor"]["ID"])

    def check(self, container_id: str) -> None:
        found = subprocess.run(
            ["docker", "inspect", container_id], capture_output=True, text=True, check=False
        )
        if found.returncode != 0:
            self.missed += 1
            return
        [info] = json.loads(found.stdout)
        self.audited.append(container_id)
        problems = audit(info)
        if problems:
            task = ((info.get("Config") or {}).get("Labels") or {}).get(TASK_LABEL, "-")
            self.violations[f"{info.get('Name')} {container_id[:12]} task={task}"] = problems

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()
