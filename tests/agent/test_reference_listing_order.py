"""The order of `str_replace_editor view /testbed` in the `reference` profile, against the
package's container on the same Docker host.

The package's `/testbed` is a directory of its image; `setup_env` makes `input/`,
`output/` and `.git` in it at run time, so every entry lives in the container's writable
layer, on the Docker host's disk, and `find` lists them in that file system's order (on
ext4: hash order, seeded per file system). Sandhive's workdir is a tmpfs volume, which lists
newest first: another order. With `SandboxConfig.workdir_on_disk` (the setting
`sandbox_reference_workdir_on_disk`) the workdir is a plain volume on the same disk, and
the listing is the package's. The package's side is its container reduced to what decides
the order: a directory made at run time in a container's writable layer.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

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

pytestmark = pytest.mark.asyncio(loop_scope="module")

EDITOR = "Execution output of \\[str_replace_editor]:\n"
HEADER = "Here's the files and directories up to 2 levels deep in /testbed, excluding hidden:\n"
FIND = (
    "find /testbed -maxdepth 2 -not -path '*/.*' "
    "\\( -type d -o -name '*.py' -o -name '*.rst' \\) | head -100"
)
CALLS: list[tuple[str, dict[str, object]]] = [
    ("str_replace_editor", {"command": "create", "path": f"/testbed/{path}", "file_text": text})
    for path, text in (("pkg/sub/mod.py", "x = 1"), ("big.py", "y = 2"), ("empty.py", ""))
] + [("execute_bash", {"command": "mkdir -p data docs && touch README.rst a.py z.py notes.txt"})]
"""What a model did before looking: the golden session's files and a few more."""
PACKAGE_SETUP = (
    "mkdir -p /testbed/input /testbed/output && cd /testbed && git init -q && "
    "mkdir -p pkg/sub && echo 'x = 1' > pkg/sub/mod.py && echo 'y = 2' > big.py && "
    "echo '' > empty.py && mkdir -p data docs && touch README.rst a.py z.py notes.txt"
)
"""The package's `setup_env`, then the same calls as its editor makes them (echo > path)."""


async def package_listing(image: str) -> str:
    """`find` in the package's kind of container: /testbed made at run time in its layer."""
    script = f"rm -rf /testbed && mkdir /testbed && {PACKAGE_SETUP} && {FIND}"
    argv = ["docker", "run", "--rm", "--network", "none"]
    argv += ["--label", f"sandhive.test={uuid.uuid4().hex}", "--entrypoint", "bash"]
    process = await asyncio.create_subprocess_exec(
        *argv, image, "-c", script, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


async def reference_listing(box: DockerSandbox) -> str:
    ctx = ToolContext(box=box, profile="reference")
    for tool, arguments in CALLS:
        await run_tool(ToolCall("c", tool, arguments, json.dumps(arguments)), ctx)
    view = {"command": "view", "path": "/testbed"}
    return (
        await run_tool(ToolCall("v", "str_replace_editor", view, json.dumps(view)), ctx)
    ).observation


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def host() -> AsyncIterator[DockerHost]:
    async with DockerHost() as docker:
        yield docker


async def sandbox(host: DockerHost, image: str, *, on_disk: bool) -> DockerSandbox:
    labels = {"sandhive.test": uuid.uuid4().hex, "sandhive.task": "tsk_listing_order"}
    cfg = SandboxConfig(image=image, labels=labels, memory_mb=512, workdir_on_disk=on_disk)
    return await host.create_sandbox(cfg)


async def test_a_workdir_on_disk_lists_testbed_in_the_packages_order(
    host: DockerHost, docker_image: str
) -> None:
    box = await sandbox(host, docker_image, on_disk=True)
    try:
        seen = await reference_listing(box)
    finally:
        await box.remove()
    package = await package_listing(docker_image)
    assert package.startswith("/testbed\n/testbed/"), package
    assert seen == EDITOR + HEADER + package


async def test_the_tmpfs_workdir_lists_in_another_order(
    host: DockerHost, docker_image: str
) -> None:
    """Why the setting exists: the default workdir lists the same entries, newest first."""
    box = await sandbox(host, docker_image, on_disk=False)
    try:
        seen = await reference_listing(box)
    finally:
        await box.remove()
    package = await package_listing(docker_image)
    listed = seen.removeprefix(EDITOR + HEADER)
    assert sorted(listed.splitlines()) == sorted(package.splitlines())
    assert listed != package


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
