"""Fixtures for the sandbox tests: a real Docker host and sandboxes removed after each test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from app.sandbox import DockerHost, DockerSandbox, SandboxConfig

MakeSandbox = Callable[..., Awaitable[DockerSandbox]]


@pytest.fixture
async def host(docker_image: str) -> AsyncIterator[DockerHost]:
    async with DockerHost() as docker_host:
        yield docker_host


@pytest.fixture
def test_labels() -> dict[str, str]:
    """Labels unique to this test, so cleanup finds exactly what it made."""
    return {"sandhive.test": uuid.uuid4().hex, "sandhive.task": "tsk_test", "sandhive.attempt": "1"}


@pytest.fixture
async def make_sandbox(
    host: DockerHost, docker_image: str, test_labels: dict[str, str]
) -> AsyncIterator[MakeSandbox]:
    async def make(**overrides: Any) -> DockerSandbox:
        options: dict[str, Any] = {"image": docker_image, "labels": test_labels, "memory_mb": 512}
        return await host.create_sandbox(SandboxConfig(**{**options, **overrides}))

    try:
        yield make
    finally:
        for container_id in await host.list_sandboxes(test_labels):
            await host.remove_container(container_id)


@pytest.fixture
async def sandbox(make_sandbox: MakeSandbox) -> DockerSandbox:
    return await make_sandbox()
