"""The container audit itself (RELIABILITY I-09): real sandboxes pass, a weak container fails,
and the session-wide watcher really sees the sandboxes that start."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from datetime import datetime

import pytest

from app.sandbox import DockerHost
from app.sandbox.policy import EgressPolicy, SandboxCaps, container_config, sandbox_config
from app.sandbox.pool import pool_labels
from app.sandbox.reaper import labels_for
from tests.support.container_audit import SandboxAuditor, audit, audit_lifetime

IMAGE = "sandhive-sandbox:latest"


def inspect(container_id: str) -> dict:
    out = subprocess.run(
        ["docker", "inspect", container_id], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)[0]


@pytest.fixture
async def host(docker_image: str) -> AsyncIterator[DockerHost]:
    labels = {"sandhive.test": uuid.uuid4().hex}
    async with DockerHost() as docker_host:
        docker_host.test_labels = labels  # type: ignore[attr-defined]
        yield docker_host
        for cid in await docker_host.list_sandboxes(labels):
            await docker_host.remove_container(cid)


async def test_a_sandbox_made_by_the_policy_passes_and_the_watcher_saw_it(
    host: DockerHost, sandbox_audit: SandboxAuditor
) -> None:
    caps = SandboxCaps(image=IMAGE, max_cpus=1, max_memory_mb=512, max_disk_mb=64)
    labels = {**host.test_labels, "sandhive.task": "tsk_audit"}  # type: ignore[attr-defined]
    config = sandbox_config(
        caps, labels=labels, cpus=0.5, memory_mb=256, disk_mb=32, network="none"
    )
    box = await host.create_sandbox(config)
    assert audit(inspect(box.id)) == []
    assert audit_lifetime(inspect(box.id)) == []
    for _ in range(100):  # the watcher runs in its own thread: poll it
        if box.id in sandbox_audit.audited:
            break
        await asyncio.sleep(0.1)
    assert box.id in sandbox_audit.audited  # the session-wide watcher audits every sandbox


def test_the_policy_with_egress_and_a_ca_bundle_passes_in_inspect_form() -> None:
    caps = SandboxCaps(
        image=IMAGE,
        max_cpus=1,
        max_memory_mb=512,
        max_disk_mb=64,
        egress=EgressPolicy(network="shv-egress-x", bridge="shvx0"),
        ca_bundle="/etc/ssl/certs/ca-certificates.crt",
    )
    labels = labels_for("inst", "tsk_1", 1, "w-1")
    cfg = sandbox_config(caps, labels=labels, cpus=1, memory_mb=256, disk_mb=32, network="egress")
    body = container_config(cfg)
    # What `docker inspect` shows for it: HostConfig as sent, Mounts as resolved.
    info = {
        "HostConfig": body["HostConfig"],
        "Config": {"Labels": body["Labels"], "Cmd": body["Cmd"]},
        "Mounts": [
            {"Type": "volume", "Source": "/var/lib/docker/volumes/x/_data", "RW": True},
            {
                "Type": "bind",
                "Source": "/etc/ssl/certs/ca-certificates.crt",
                "Destination": "/etc/sandhive/ca-bundle.crt",
                "RW": False,
            },
        ],
    }
    assert audit(info) == []
    assert audit_lifetime(info) == []


def test_a_weak_container_is_flagged() -> None:
    """Negative control: the audit catches what a careless `docker run` would do."""
    created = subprocess.run(
        [
            "docker",
            "create",
            "--label",
            "sandhive.test-weak=1",
            "--cap-add",
            "SYS_ADMIN",
            "--cap-add",
            "NET_RAW",
            "--security-opt",
            "seccomp=unconfined",
            "-v",
            "/var/run/docker.sock:/var/run/docker.sock",
            "-p",
            "127.0.0.1::8000",
            "--ipc",
            "host",
            "--restart",
            "always",
            IMAGE,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    container_id = created.stdout.strip()
    try:
        info = inspect(container_id)
        problems = " | ".join(audit(info) + audit_lifetime(info))
    finally:
        subprocess.run(["docker", "rm", "-f", container_id], capture_output=True, check=False)
    for expected in (
        "CapDrop",
        "SYS_ADMIN",
        "no-new-privileges",
        "seccomp=unconfined",
        "PidsLimit",
        "Memory",
        "CPU",
        "IpcMode 'host'",
        "NetworkMode 'bridge'" if "NetworkMode 'bridge'" in problems else "NetworkMode",
        "published ports",
        "docker.sock",
        "writable",
        "no init",
        "restart policy",
        "sandhive.managed",
        "no AutoRemove",
        "no deadline",
    ):
        assert expected in problems, (expected, problems)


def labelled(labels: dict[str, str]) -> list[str]:
    """The audit's verdict on a policy-made sandbox that carries these labels."""
    caps = SandboxCaps(image=IMAGE, max_cpus=1, max_memory_mb=512, max_disk_mb=64)
    cfg = sandbox_config(caps, labels=labels, cpus=1, memory_mb=256, disk_mb=32, network="none")
    body = container_config(cfg)
    return audit({"HostConfig": body["HostConfig"], "Config": {"Labels": body["Labels"]}})


def test_task_sandboxes_must_say_whose_they_are() -> None:
    """C1.8: the reaper and operators tell a task sandbox's deployment, task, attempt, worker
    and age from its labels; a warm-pool one (no task yet) from instance and worker."""
    task = labels_for("inst", "tsk_1", 2, "w-1")
    assert labelled(task) == []
    assert datetime.fromisoformat(task["sandhive.created_at"]).tzinfo is not None
    assert labelled(pool_labels("inst", "w-1")) == []
    for key in ("sandhive.instance", "sandhive.attempt", "sandhive.worker", "sandhive.created_at"):
        missing = {k: v for k, v in task.items() if k != key}
        assert labelled(missing) == [f"no {key} label"], key
    assert labelled({**task, "sandhive.attempt": "0"}) == [
        "sandhive.attempt '0' is not an attempt number"
    ]
    assert labelled({**task, "sandhive.created_at": "yesterday"}) == [
        "sandhive.created_at 'yesterday' is not an ISO 8601 time"
    ]
    assert labelled({"sandhive.task": "tsk_1"}) != []  # a bare task label is not enough
    assert labelled({"sandhive.pool": "1", "sandhive.worker": "w-1"}) == [
        "no sandhive.instance label"
    ]
    # Made outside any deployment (sandbox-layer tests, `sandhive local`, the bench): exempt.
    assert labelled({"sandhive.local": "1"}) == []
