"""The reaper removes this deployment's orphaned sandbox volumes, and no other volume."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from app.sandbox.policy import SandboxConfig
from app.sandbox.reaper import labels_for
from app.worker.context import WorkerContext
from app.worker.reaping import reap


@pytest.fixture
def volumes(made: list[str]) -> Iterator[list[str]]:
    """Names of volumes a test makes or leaves behind; all removed afterwards, after the
    containers in `made` (with their volumes: a volume in use cannot go)."""
    names: list[str] = []
    yield names
    if made:
        subprocess.run(["docker", "rm", "-f", "-v", *made], capture_output=True, check=False)
    if names:
        subprocess.run(["docker", "volume", "rm", "-f", *names], capture_output=True, check=False)


def workdir_volume(container_id: str) -> str:
    out = subprocess.run(
        ["docker", "inspect", container_id], capture_output=True, text=True, check=True
    )
    [info] = json.loads(out.stdout)
    return str(next(m["Name"] for m in info["Mounts"] if m["Destination"] == "/testbed"))


def remove_without_volumes(container_id: str) -> None:
    """`docker rm` without -v: how a sandbox's workdir volume is left behind."""
    subprocess.run(["docker", "rm", "-f", container_id], capture_output=True, check=True)


def volume_exists(name: str) -> bool:
    probe = subprocess.run(["docker", "volume", "inspect", name], capture_output=True, check=False)
    return probe.returncode == 0


def create_volume(volumes: list[str], labels: dict[str, str]) -> str:
    name = f"sandhive-test-{uuid.uuid4().hex[:12]}"
    args = ["docker", "volume", "create"]
    for key, value in labels.items():
        args += ["--label", f"{key}={value}"]
    subprocess.run([*args, name], capture_output=True, check=True)
    volumes.append(name)
    return name


async def test_reap_removes_orphaned_volumes_of_this_deployment_only(
    ctx: WorkerContext, docker_image: str, made: list[str], volumes: list[str]
) -> None:
    managed = {"sandhive.managed": "1", "sandhive.instance": ctx.instance}
    host = ctx.docker
    # A sandbox whose container went without its workdir (`docker rm` without -v).
    labels = labels_for(ctx.instance, "tsk_gone", 1, "w-dead")
    gone = await host.create_sandbox(SandboxConfig(image=docker_image, labels=labels))
    made.append(gone.id)
    orphan = workdir_volume(gone.id)
    volumes.append(orphan)
    remove_without_volumes(gone.id)
    # A live sandbox of this worker's: its workdir is in use.
    labels = labels_for(ctx.instance, "tsk_mine", 1, ctx.name)
    live = await host.create_sandbox(SandboxConfig(image=docker_image, labels=labels))
    made.append(live.id)
    in_use = workdir_volume(live.id)
    volumes.append(in_use)
    doomed = {
        orphan: "workdir of a removed sandbox",
        create_volume(volumes, managed): "our labels, no container",
    }
    kept = {
        in_use: "workdir of a live sandbox",
        create_volume(volumes, {**managed, "sandhive.instance": "other"}): "another deployment's",
        create_volume(volumes, {"sandhive.instance": ctx.instance}): "not marked managed",
        create_volume(volumes, {}): "not Sandhive's",
    }
    assert all(volume_exists(name) for name in [*doomed, *kept])

    removed = await reap(ctx, {"tsk_mine"})

    assert removed == [], "no container was doomed"
    assert [why for name, why in doomed.items() if volume_exists(name)] == []
    assert [why for name, why in kept.items() if not volume_exists(name)] == []
    assert (await live.exec(["true"])).exit_code == 0
