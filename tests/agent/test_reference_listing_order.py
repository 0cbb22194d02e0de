"""The order of `str_replace_editor view /testbed` in the `reference` profile, against the
paper's package itself on the same Docker host.

The package's `/testbed` is a directory of its image; `setup_env` makes `input/`,
`output/` and `.git` in it at run time, so every entry lives in the container's writable
layer, on the Docker host's disk, and `find` lists them in that file system's order (on
ext4: hash order, seeded per file system, so no recording can hold it). Sandhive's workdir
is a tmpfs volume, which lists newest first: another order. With
`SandboxConfig.workdir_on_disk` (the setting `sandbox_reference_workdir_on_disk`) the
workdir is a plain volume on the same disk, and the listing is the package's. The
package's side is its own `DockerRuntime` and `Agent._execute_action`
(tests/agent/golden/package_listing.py, from `make reference-package`), run live beside
Sandhive on an image whose `/testbed` is empty, as the package's Dockerfile makes it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from app.agent.tools import ToolContext, run_tool
from app.agent.types import ToolCall
from app.config import Settings
from app.domain.resolve import resolve_spec
from app.runner.episode import Runner
from app.sandbox import DockerHost, DockerSandbox, SandboxConfig
from app.sandbox.policy import container_config
from app.schemas.tasks import TaskCreate
from tests.agent.golden.package_listing import CALLS, VIEW

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_LIB = ROOT / ".package-lib"
SCRIPT = ROOT / "tests" / "agent" / "golden" / "package_listing.py"
EDITOR = "Execution output of \\[str_replace_editor]:\n"
HEADER = "Here's the files and directories up to 2 levels deep in /testbed, excluding hidden:\n"


PACKAGE_TESTBED = "FROM {image}\nRUN rm -rf /testbed && mkdir /testbed\n"
"""The package's image as far as the listing goes: its Dockerfile makes an empty /testbed.
Ours has input/ and output/ in it, and overlayfs lists entries of the image's layers before
those made at run time: run on ours, the package would list them first."""


async def package_image(image: str) -> str:
    tag = "sandhive-test-package-testbed:latest"
    argv = ["docker", "build", "-q", "-t", tag, "-"]
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate(PACKAGE_TESTBED.format(image=image).encode())
    assert process.returncode == 0, err.decode()
    return tag


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def package(docker_image: str) -> dict[str, Any]:
    """What the package answered, in a container of its own on this host."""
    if not (PACKAGE_LIB / "llm_in_sandbox").is_dir():
        pytest.fail(
            f"the paper's package is not in {PACKAGE_LIB}: run `make reference-package`",
            pytrace=False,
        )
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_LIB)}
    argv = [sys.executable, str(SCRIPT), await package_image(docker_image), uuid.uuid4().hex]
    process = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()[-2000:]
    [line] = [line for line in out.decode().splitlines() if line.startswith("{")]
    answer: dict[str, Any] = json.loads(line)
    return answer


async def reference_listing(box: DockerSandbox) -> dict[str, Any]:
    """Sandhive's `reference` profile through the same calls, shaped as the package's answer."""
    ctx = ToolContext(box=box, profile="reference")
    seen = []
    for tool, arguments in [*CALLS, ("str_replace_editor", VIEW)]:
        call = ToolCall("c", tool, arguments, json.dumps(arguments))
        seen.append((await run_tool(call, ctx)).observation)
    return {"calls": seen[:-1], "view": seen[-1]}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def host() -> AsyncIterator[DockerHost]:
    async with DockerHost() as docker:
        yield docker


async def sandbox(host: DockerHost, image: str, *, on_disk: bool) -> DockerSandbox:
    labels = {"sandhive.test": uuid.uuid4().hex, "sandhive.task": "tsk_listing_order"}
    cfg = SandboxConfig(image=image, labels=labels, memory_mb=512, workdir_on_disk=on_disk)
    return await host.create_sandbox(cfg)


async def test_a_workdir_on_disk_lists_testbed_in_the_packages_order(
    host: DockerHost, docker_image: str, package: dict[str, Any]
) -> None:
    box = await sandbox(host, docker_image, on_disk=True)
    try:
        seen = await reference_listing(box)
    finally:
        await box.remove()
    assert package["view"].startswith(EDITOR + HEADER + "/testbed\n/testbed/"), package
    assert seen["calls"] == package["calls"]
    assert seen["view"].splitlines() == package["view"].splitlines()


async def test_the_tmpfs_workdir_lists_in_another_order(
    host: DockerHost, docker_image: str, package: dict[str, Any]
) -> None:
    """Why the setting exists: the default workdir lists the same entries, newest first."""
    box = await sandbox(host, docker_image, on_disk=False)
    try:
        seen = await reference_listing(box)
    finally:
        await box.remove()
    assert seen["calls"] == package["calls"]
    listed, expected = seen["view"].splitlines(), package["view"].splitlines()
    assert sorted(listed) == sorted(expected)
    assert listed != expected


async def test_the_on_disk_workdir_goes_with_its_sandbox(
    host: DockerHost, docker_image: str
) -> None:
    """It is on the host's disk: removing the sandbox must remove the volume too."""
    box = await sandbox(host, docker_image, on_disk=True)
    info = json.loads((await docker("container", "inspect", box.id))[0])[0]
    [mount] = [m for m in info["Mounts"] if m["Destination"] == "/testbed"]
    volume = json.loads((await docker("volume", "inspect", mount["Name"]))[0])[0]
    assert volume["Options"] in (None, {}), "a plain local volume, no tmpfs options"
    await box.remove()
    for _ in range(25):
        _, code = await docker("volume", "inspect", mount["Name"])
        if code != 0:
            break
        await asyncio.sleep(0.2)
    assert code != 0, "the volume outlived its sandbox"


async def test_only_reference_tasks_get_it_and_only_when_the_server_says_so() -> None:
    def workdir_on_disk(profile: str, setting: bool) -> bool:
        settings = Settings(
            _env_file=None,
            llm_base_url="http://127.0.0.1:9/v1",
            llm_model="m",
            sandbox_reference_workdir_on_disk=setting,
        )
        body = TaskCreate.model_validate({"prompt": "p", "tools": {"profile": profile}})
        episode = Runner(settings, DockerHost()).episode(
            resolve_spec(body, settings), "p", labels={}
        )
        return episode.sandbox.workdir_on_disk

    assert workdir_on_disk("reference", True)
    assert not workdir_on_disk("reference", False)
    assert not workdir_on_disk("standard", True)
    body = container_config(SandboxConfig(image="i", labels={}, workdir_on_disk=False))
    [tmpfs] = body["HostConfig"]["Mounts"]
    assert tmpfs["VolumeOptions"]["DriverConfig"]["Options"]["type"] == "tmpfs"


async def docker(*args: str) -> tuple[str, int]:
    process = await asyncio.create_subprocess_exec(
        "docker", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    out, _ = await process.communicate()
    return out.decode(), int(process.returncode or 0)
