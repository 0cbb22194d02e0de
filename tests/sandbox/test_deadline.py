"""Every sandbox has a deadline of its own: past it the container ends and Docker removes it
and its workdir volume by itself, whatever became of the worker that made it."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import replace

import pytest

from app.config import Settings
from app.domain.resolve import resolve_spec
from app.errors import SandboxError
from app.runner.episode import Runner, sandbox_deadline_s
from app.sandbox import DockerHost, SandboxConfig
from app.sandbox.policy import container_config
from app.sandbox.pool import WarmPool
from app.schemas.tasks import TaskCreate
from tests.sandbox.conftest import MakeSandbox
from tests.support.docker_objects import docker_inspect


def test_the_main_command_is_a_sleep_as_long_as_the_deadline() -> None:
    body = container_config(SandboxConfig(image="img:1", labels={}, deadline_s=12.2))
    assert body["Cmd"] == ["sleep", "13"], "whole seconds, never shorter than asked"
    assert body["HostConfig"]["AutoRemove"] is True
    assert body["HostConfig"]["Init"] is True


@pytest.mark.parametrize("deadline_s", [0, -5, math.inf, math.nan])
def test_a_sandbox_without_a_finite_deadline_is_refused(deadline_s: float) -> None:
    with pytest.raises(ValueError, match="deadline_s"):
        SandboxConfig(image="img:1", labels={}, deadline_s=deadline_s)


def test_a_tasks_sandbox_lives_its_timeout_plus_the_graces() -> None:
    settings = Settings(
        _env_file=None,
        llm_base_url="http://127.0.0.1:9/v1",
        llm_model="m",
        artifact_collect_grace_s=2.0,
        sandbox_deadline_grace_s=7.0,
    )
    body = TaskCreate.model_validate({"prompt": "p", "limits": {"timeout_s": 30}})
    spec = resolve_spec(body, settings)
    episode = Runner(settings, DockerHost()).episode(spec, "p", labels={})
    assert episode.sandbox.deadline_s == 30 + 2 + 7 == sandbox_deadline_s(settings, 30)
    assert episode.agent.timeout_s == 30


async def test_at_its_deadline_docker_removes_the_sandbox_and_its_volume(
    make_sandbox: MakeSandbox,
) -> None:
    box = await make_sandbox(deadline_s=3)
    started = time.monotonic()
    info = docker_inspect("container", box.id)
    assert info is not None
    [volume] = [m["Name"] for m in info["Mounts"] if m["Destination"] == "/testbed"]
    assert docker_inspect("volume", volume) is not None
    assert (await box.exec(["true"])).exit_code == 0
    while docker_inspect("container", box.id) is not None:
        assert time.monotonic() - started < 20, "the sandbox outlived its deadline"
        await asyncio.sleep(0.2)
    assert time.monotonic() - started > 2, "not before its deadline"
    for _ in range(25):  # the daemon removes the volume right after the container
        if docker_inspect("volume", volume) is None:
            break
        await asyncio.sleep(0.2)
    assert docker_inspect("volume", volume) is None, "its workdir volume went with it"
    with pytest.raises(SandboxError):
        await box.exec(["true"])
    await box.remove()  # the episode's own removal, after Docker's: quiet


async def test_a_pooled_sandbox_outlives_its_wait_and_any_task(
    host: DockerHost, docker_image: str, test_labels: dict[str, str]
) -> None:
    """Made before its task is known: it lives max_age_s + task_deadline_s, and is handed
    only to a task whose own deadline still fits in what it has left."""
    pool = WarmPool(host, size=1, labels=test_labels, max_age_s=30, task_deadline_s=100)
    task = SandboxConfig(image=docker_image, labels=test_labels, memory_mb=512, deadline_s=50)
    try:
        pool.start(task)
        await pool.wait_ready(task)
        [waiting] = await host.list_sandboxes(test_labels)
        info = docker_inspect("container", waiting)
        assert info is not None
        assert info["Config"]["Cmd"] == ["sleep", "130"]
        assert pool.claim(replace(task, deadline_s=130)) is None, "less than 130 s left now"
        assert pool.ready(task) == 1, "kept for a task it fits"
        box = pool.claim(task)  # another deadline, the same shape
        assert box is not None
        assert box.id == waiting
        await box.remove()
    finally:
        await pool.close()
