"""Warm sandboxes for `/v1/sandboxes` (`SANDHIVE_SANDBOX_WARM_POOL_SIZE`): a create of the
default shape takes a container started before it was asked for, the pool refills, another
shape starts its own container, and a worker's successor removes what its pool left."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

from app.config import Settings
from app.sandbox import DockerHost
from app.sandbox.policy import SANDBOX_LABEL
from app.sandbox.reaper import INSTANCE_LABEL, POOL_LABEL, WORKER_LABEL
from tests.sandboxes.conftest import ALICE, create, run
from tests.support.processes import ready_worker

POOLED = {SANDBOX_LABEL: "pool", POOL_LABEL: "1"}


async def pooled(settings: Settings) -> set[str]:
    """Ids of the warm pool's containers of this test's worker, claimed ones included (a
    worker a test before SIGKILLed may leave one it was starting)."""
    assert settings.worker_name is not None
    labels = {
        **POOLED,
        INSTANCE_LABEL: settings.instance_name(),
        WORKER_LABEL: settings.worker_name,
    }
    async with DockerHost() as docker:
        return set(await docker.list_sandboxes(labels))


async def until(check: Callable[[], object], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():  # type: ignore[misc]
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.2)


async def ready_in_log(log: Path, count: int) -> None:
    """Until the worker (at DEBUG) has logged `count` warm sandboxes ready in all: its
    containers exist (and `pooled` counts them) a moment before they can be claimed, and
    on a loaded machine a create in that moment is a cold one."""

    async def logged() -> bool:
        text = await asyncio.to_thread(log.read_text, errors="replace")
        return len(re.findall(r"warm sandbox \S+ ready \(", text)) >= count

    await until(logged, f"{count} warm sandboxes ready")


def holds(container: str, path: str) -> bool:
    done = subprocess.run(
        ["docker", "exec", container, "test", "-e", path], capture_output=True, check=False
    )
    return done.returncode == 0


async def marked_among(api: httpx.AsyncClient, sandbox_id: str, containers: set[str]) -> list[str]:
    """The containers of `containers` holding a file only the sandbox `sandbox_id` wrote."""
    marker = f"/tmp/mark-{uuid.uuid4().hex}"
    assert (await run(api, sandbox_id, argv=["touch", marker]))["exit_code"] == 0
    return [c for c in containers if holds(c, marker)]


async def test_a_default_create_takes_a_warm_sandbox_and_the_pool_refills(
    make_sandbox_settings: Callable[..., Settings], api: httpx.AsyncClient, tmp_path: Path
) -> None:
    settings = make_sandbox_settings(
        sandbox_warm_pool_size=2, worker_name=f"pooler-{uuid.uuid4().hex[:8]}", log_level="DEBUG"
    )
    with ready_worker(settings, tmp_path / "worker.log"):
        await ready_in_log(tmp_path / "worker.log", 2)  # before any create
        ready = await pooled(settings)
        assert len(ready) == 2
        made = await create(api)
        assert len(await marked_among(api, made["id"], ready)) == 1, "not one of the warm ones"

        async def refilled() -> bool:
            return len(await pooled(settings)) == 3  # the claimed one and two ready again

        await until(refilled, "the pool refilled behind the claim")
        shaped = await create(api, env={"LANG_OF_MINE": "x"})
        assert await marked_among(api, shaped["id"], await pooled(settings)) == []
        env = await run(api, shaped["id"], argv=["sh", "-c", "echo $LANG_OF_MINE"])
        assert env["stdout"] == "x\n"
        before = await pooled(settings)
        deleted = await api.delete(f"/v1/sandboxes/{made['id']}", headers=ALICE)
        assert deleted.status_code == 200, deleted.text

        async def removed() -> bool:
            return len(before - await pooled(settings)) == 1

        await until(removed, "the deleted warm sandbox's container went")


async def test_a_successor_removes_what_its_predecessors_pool_left(
    make_sandbox_settings: Callable[..., Settings], api: httpx.AsyncClient, tmp_path: Path
) -> None:
    """SIGKILLed, a worker leaves its warm sandboxes and a claimed one; the next worker
    under its name (with no pool) removes them at its start."""
    name = f"pooler-{uuid.uuid4().hex[:8]}"
    settings = make_sandbox_settings(sandbox_warm_pool_size=1, worker_name=name, log_level="DEBUG")
    with ready_worker(settings, tmp_path / "first.log") as first:
        await ready_in_log(tmp_path / "first.log", 1)
        await create(api)

        async def refilled() -> bool:
            return len(await pooled(settings)) == 2

        await until(refilled, "the pool refilled")
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    left = await pooled(settings)
    assert len(left) == 2
    successor = make_sandbox_settings(worker_name=name)
    with ready_worker(successor, tmp_path / "second.log"):
        assert not await pooled(settings), "the successor kept its predecessor's pool"
