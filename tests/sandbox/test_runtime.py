"""SANDHIVE_SANDBOX_RUNTIME: the OCI runtime reaches the create() body, and readiness says
when the daemon does not know it (every create would fail), against the real daemon."""

from __future__ import annotations

import pytest

from app.errors import SandboxError
from app.sandbox import DockerHost
from app.sandbox.policy import SandboxCaps, SandboxConfig, container_config, sandbox_config


def test_the_runtime_is_the_servers_choice_in_the_body() -> None:
    caps = SandboxCaps(image="x", max_cpus=1, max_memory_mb=512, max_disk_mb=64, runtime="crun")
    config = sandbox_config(caps, labels={}, cpus=1, memory_mb=256, disk_mb=64, network="none")
    assert config.runtime == "crun"
    assert container_config(config)["HostConfig"]["Runtime"] == "crun"
    assert container_config(SandboxConfig(image="x", labels={}))["HostConfig"]["Runtime"] == "runc"


async def test_readiness_reports_a_runtime_the_daemon_lacks() -> None:
    async with DockerHost(runtime="sandhive-no-such-runtime") as host:
        with pytest.raises(SandboxError, match="no OCI runtime 'sandhive-no-such-runtime'"):
            await host.ping()
    async with DockerHost(runtime="runc") as host:
        await host.ping()


async def test_a_crun_sandbox_starts_runs_commands_and_keeps_its_limits(
    docker_image: str, test_labels: dict[str, str]
) -> None:
    """crun runs the same hardened sandbox (deploy/setup-host.sh makes a cgroup v1 "hybrid"
    host acceptable to it); the attack tests run under both runtimes."""
    config = SandboxConfig(
        image=docker_image, labels=test_labels, runtime="crun", memory_mb=256, pids_limit=64
    )
    # cgroup v2 keeps the limits at the root of the container's namespace, v1 per controller.
    limits = (
        "cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max; "
        "cat /sys/fs/cgroup/memory.max 2>/dev/null"
        " || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
    )
    async with DockerHost(runtime="crun") as host:
        await host.ping()
        box = await host.create_sandbox(config)
        try:
            shown = await host.api().containers.get(box.id)
            assert box.uses_channel, "commands go through the exec channel under crun too"
            done = await box.exec(["sh", "-c", f"id -u; {limits}; echo hi > /etc/x"], timeout_s=30)
        finally:
            await box.remove()
    assert shown["HostConfig"]["Runtime"] == "crun"
    uid, pids, memory = done.stdout.decode().split()
    assert (uid, pids) == ("0", "64")
    assert int(memory) == shown["HostConfig"]["Memory"]  # the body's limit, kept by crun
    assert b"Read-only file system" in done.stderr
