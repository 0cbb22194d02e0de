"""Fixtures for the tool tests: real sandbox containers, shared per test module for speed.

Each module gets one Docker host and a factory whose containers are all removed
when the module ends; tests that need a pristine /testbed make their own.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest_asyncio

from app.sandbox import DockerHost, DockerSandbox, SandboxConfig

MakeBox = Callable[[], Awaitable[DockerSandbox]]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def make_box(docker_image: str) -> AsyncIterator[MakeBox]:
    """Create sandboxes labelled for this module; all removed at its end."""
    labels = {"sandhive.test": uuid.uuid4().hex, "sandhive.task": "tsk_agent_tools"}
    async with DockerHost() as host:

        async def make() -> DockerSandbox:
            return await host.create_sandbox(
                SandboxConfig(image=docker_image, labels=labels, memory_mb=512)
            )

        try:
            yield make
        finally:
            for container_id in await host.list_sandboxes(labels):
                await host.remove_container(container_id)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def box(make_box: MakeBox) -> DockerSandbox:
    """One sandbox shared by the tests of a module (they use distinct paths)."""
    return await make_box()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def direct(docker_image: str) -> AsyncIterator[DockerSandbox]:
    """A sandbox without the exec channel: one `docker exec` per command (images
    without python3), for the paths that must work, or refuse cleanly, without it."""
    labels = {"sandhive.test": uuid.uuid4().hex, "sandhive.task": "tsk_agent_direct"}
    async with DockerHost(exec_channel=False) as host:
        box = await host.create_sandbox(
            SandboxConfig(image=docker_image, labels=labels, memory_mb=512)
        )
        try:
            yield box
        finally:
            await box.remove()
