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
    async with DockerHost(runtime="crun") as host:
        await host.ping()
        box = await host.create_sandbox(config)
        try:
            shown = await host.api().containers.get(box.id)
            assert box.uses_channel, "commands go through the exec channel under crun too"
            done = await box.exec(
                ["sh", "-c", "id -u; cat /sys/fs/cgroup/pids/pids.max; echo hi > /etc/x"],
                timeout_s=30,
            )
        finally:
            await box.remove()
    assert shown["HostConfig"]["Runtime"] == "crun"
    assert done.stdout.decode().split() == ["0", "64"]
    assert b"Read-only file system" in done.stderr


async def test_the_daemon_makes_the_container_with_that_runtime(
    docker_image: str, test_labels: dict[str, str]
) -> None:
    """The body names the runtime and the daemon keeps it."""
    config = SandboxConfig(image=docker_image, labels=test_labels, runtime="crun")
    async with DockerHost() as host:
        info = await host.api().system.info()
        assert "crun" in info["Runtimes"], "crun is not registered: run deploy/setup-host.sh"
        container = await host.api().containers.create(container_config(config))
        try:
            shown = await container.show()
        finally:
            await host.remove_container(container.id)
    assert shown["HostConfig"]["Runtime"] == "crun"
