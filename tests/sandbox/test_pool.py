"""The warm pool on the real Docker daemon: ready sandboxes, each handed out once, then gone."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace

import pytest

from app.agent.types import Step
from app.config import Settings
from app.domain.resolve import resolve_spec
from app.runner.episode import Runner
from app.sandbox import DockerHost, SandboxConfig
from app.sandbox.pool import WarmPool, pool_labels
from app.schemas.tasks import TaskCreate
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.support.docker_calls import DockerCalls, docker_calls

__all__ = ["docker_calls"]


@pytest.fixture
async def pooled(host: DockerHost, test_labels: dict[str, str]) -> AsyncIterator[WarmPool]:
    labels = {**pool_labels("pooltest", "w-test"), **test_labels}
    pool = WarmPool(host, size=2, labels=labels)
    try:
        yield pool
    finally:
        await pool.close()
        for container_id in await host.list_sandboxes(test_labels):
            await host.remove_container(container_id)


def shape(docker_image: str, **overrides: object) -> SandboxConfig:
    config = SandboxConfig(image=docker_image, labels={"sandhive.task": "tsk_x"}, memory_mb=512)
    return replace(config, **overrides)  # type: ignore[arg-type]


async def test_pool_fills_hands_out_each_sandbox_once_and_refills(
    host: DockerHost, pooled: WarmPool, docker_image: str, test_labels: dict[str, str]
) -> None:
    config = shape(docker_image)
    pooled.start(config)
    await pooled.wait_ready(config)
    assert len(await host.list_sandboxes({**test_labels, "sandhive.pool": "1"})) == 2
    first, second = pooled.claim(config), pooled.claim(config)
    assert first is not None
    assert second is not None
    assert first.id != second.id
    assert first.uses_channel
    done = await first.exec(["sh", "-c", "ls -d /testbed/input /testbed/output /testbed/.git"])
    assert done.exit_code == 0, "a pooled sandbox is set up like a cold one"
    await pooled.wait_ready(config)  # refilled in the background
    third = pooled.claim(config)
    assert third is not None
    assert third.id not in (first.id, second.id)
    for box in (first, second, third):
        await box.remove()


async def test_a_pool_told_to_wait_refills_once_claims_pause_or_it_ran_out(
    host: DockerHost, docker_image: str, test_labels: dict[str, str], docker_calls: DockerCalls
) -> None:
    """`refill_after_s` (the sandbox API's pool): no container starts while claims keep
    coming and some are still ready; an empty pool refills at once."""
    labels = {**pool_labels("pooltest", "w-test"), **test_labels}
    pool = WarmPool(host, size=2, labels=labels, refill_after_s=600.0)
    config = shape(docker_image)
    claimed = []
    try:
        pool.start(config)
        await pool.wait_ready(config)
        docker_calls.calls.clear()
        claimed.append(pool.claim(config))
        await asyncio.sleep(1.0)  # a filler that did not wait would have asked for one
        assert docker_calls.calls[("POST", "containers/create")] == 0, "refilled mid-burst"
        assert pool.ready(config) == 1
        claimed.append(pool.claim(config))
        await pool.wait_ready(config)  # ran out: refilled without waiting the 600 s
    finally:
        await pool.close()
        for box in claimed:
            if box is not None:
                await box.remove()


async def test_a_pool_that_may_not_learn_or_is_closed_starts_nothing(
    host: DockerHost, docker_image: str, test_labels: dict[str, str], docker_calls: DockerCalls
) -> None:
    """`claim(learn=False)` of a shape never started is None and keeps it not (a caller's env
    is never kept warm); after `close`, a claim racing a stop starts no filler."""
    labels = {**pool_labels("pooltest", "w-test"), **test_labels}
    pool = WarmPool(host, size=1, labels=labels)
    other = shape(docker_image, env={"SECRET_OF_MINE": "x"})
    try:
        assert pool.claim(other, learn=False) is None
        await asyncio.sleep(1.0)
        assert pool.ready(other) == 0
        await pool.close()
        assert pool.claim(shape(docker_image)) is None
        await asyncio.sleep(1.0)
        assert docker_calls.calls[("POST", "containers/create")] == 0
    finally:
        await pool.close()


async def test_unknown_shape_is_cold_then_learnt(pooled: WarmPool, docker_image: str) -> None:
    small = shape(docker_image, memory_mb=256)
    assert pooled.claim(small) is None
    await pooled.wait_ready(small)
    assert pooled.claim(shape(docker_image, memory_mb=384)) is None, "shapes never mix"
    box = pooled.claim(small)
    assert box is not None
    await box.remove()


async def test_aged_or_dead_sandboxes_are_replaced_not_handed_out(
    host: DockerHost, docker_image: str, test_labels: dict[str, str]
) -> None:
    config = shape(docker_image)
    pool = WarmPool(host, size=1, labels=test_labels, max_age_s=1.0)
    try:
        pool.start(config)
        await pool.wait_ready(config)
        old_ids = set(await host.list_sandboxes(test_labels))
        await asyncio.sleep(1.2)
        fresh = pool.claim(config)
        assert fresh is None or fresh.id not in old_ids
        if fresh is not None:
            await fresh.remove()
        await pool.wait_ready(config)
        for _ in range(50):  # the aged one is removed in the background
            if not old_ids & set(await host.list_sandboxes(test_labels)):
                break
            await asyncio.sleep(0.1)
        assert not old_ids & set(await host.list_sandboxes(test_labels))
    finally:
        await pool.close()
    assert await host.list_sandboxes(test_labels) == [], "close removes what still waits"


class NullSink:
    def __init__(self) -> None:
        self.steps: list[Step] = []

    async def step_started(self, index: int) -> None:
        return None

    async def step_completed(self, step: Step, next_index: int | None = None) -> None:
        self.steps.append(step)

    async def live(self, kind: str, data: Mapping[str, object]) -> None:
        return None


async def test_episode_runs_in_a_pooled_sandbox_and_removes_it(
    host: DockerHost,
    pooled: WarmPool,
    docker_image: str,
    settings: Settings,
    scripted_llm: ScriptedLLMServer,
    test_labels: dict[str, str],
) -> None:
    model_name = f"pool-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(
        model_name,
        Script(
            [
                Turn("execute_bash", {"command": "hostname; cat input/in.txt"}),
                Turn("submit", {}),
            ]
        ),
    )
    runner = Runner(settings, host, pool=pooled)
    options = {"model": model_name, "temperature": 0.0, "max_tokens_per_call": 256}
    body = TaskCreate.model_validate({"prompt": "u", "llm": options, "limits": {"max_steps": 5}})
    spec = resolve_spec(body, settings)
    config = runner.episode(spec, "u", labels=test_labels).sandbox
    pooled.start(config)
    await pooled.wait_ready(config)
    waiting = set(await host.list_sandboxes({**test_labels, "sandhive.pool": "1"}))
    sink = NullSink()
    inputs = [("in.txt", b"from the task\n")]
    result = await runner.run(spec, "u", sink, labels=test_labels, inputs=inputs)
    assert result.outcome.error is None
    observation = sink.steps[0].observation
    used = [cid for cid in waiting if cid[:12] in observation]
    assert len(used) == 1, observation
    assert "from the task" in observation, "inputs are copied in at claim time"
    assert used[0] not in await host.list_sandboxes(test_labels), "removed after the task"
