"""The reaper on the real Docker daemon: exactly the doomed sandboxes go, nothing else."""

from __future__ import annotations

import asyncio
import subprocess

from app.bus import leases
from app.sandbox.pool import pool_labels
from app.sandbox.python_scorer.score import RUN_LABEL, SCORER_LABEL
from app.sandbox.reaper import CREATED_LABEL, INSTANCE_LABEL, WORKER_LABEL, labels_for
from app.worker.context import WorkerContext
from app.worker.reaping import reap, remove_own_pool
from tests.support.rows import insert_task


def start_container(made: list[str], image: str, labels: dict[str, str]) -> str:
    args = ["docker", "run", "-d", "--network", "none"]
    for key, value in labels.items():
        args += ["--label", f"{key}={value}"]
    out = subprocess.run([*args, image, "sleep", "600"], capture_output=True, text=True, check=True)
    made.append(out.stdout.strip())
    return made[-1]


def exists(container_id: str) -> bool:
    probe = subprocess.run(["docker", "inspect", container_id], capture_output=True, check=False)
    return probe.returncode == 0


async def test_reap_removes_exactly_the_doomed(
    ctx: WorkerContext, docker_image: str, made: list[str]
) -> None:
    sessions = ctx.sessions
    finished = await insert_task(sessions, status="succeeded", attempt=1)
    reclaimed = await insert_task(sessions, status="running", attempt=2)
    healthy = await insert_task(sessions, status="running", attempt=1)
    orphaned = await insert_task(sessions, status="running", attempt=1)
    mine = await insert_task(sessions, status="running", attempt=1)
    await leases.beat(ctx.redis, "w-alive", 60_000, {})

    def ours(task_id: str, attempt: int, worker: str) -> dict[str, str]:
        return {"sandhive.managed": "1", **labels_for(ctx.instance, task_id, attempt, worker)}

    doomed = {
        start_container(made, docker_image, ours(finished, 1, "w-alive")): "task finished",
        start_container(made, docker_image, ours(reclaimed, 1, "w-alive")): "older attempt",
        start_container(made, docker_image, ours(orphaned, 1, "w-dead")): "worker gone",
        start_container(made, docker_image, ours("tsk_unknown", 1, "w-alive")): "unknown task",
    }
    kept = {
        start_container(made, docker_image, ours(healthy, 1, "w-alive")): "live attempt",
        start_container(made, docker_image, ours(mine, 1, "w-me")): "this worker's own",
        start_container(
            made, docker_image, {**ours(finished, 1, "w-dead"), "sandhive.instance": "other"}
        ): "another deployment's",
        start_container(made, docker_image, {}): "not Sandhive's",
        start_container(
            made,
            docker_image,
            {k: v for k, v in ours(finished, 1, "w-dead").items() if k != "sandhive.managed"},
        ): "not marked managed",
    }

    removed = await reap(ctx, {mine})

    assert sorted(removed) == sorted(doomed), {doomed.get(r, kept.get(r)) for r in removed}
    assert [why for cid, why in doomed.items() if exists(cid)] == []
    assert [why for cid, why in kept.items() if not exists(cid)] == []


async def test_a_worker_whose_heartbeat_returns_keeps_its_sandboxes(
    ctx: WorkerContext, docker_image: str, made: list[str]
) -> None:
    """A Redis restart drops every heartbeat; a live worker beats again before the re-check."""
    task_id = await insert_task(ctx.sessions, status="running", attempt=1)
    labels = {"sandhive.managed": "1", **labels_for(ctx.instance, task_id, 1, "w-blinking")}
    container = start_container(made, docker_image, labels)

    async def beat_soon() -> None:
        await asyncio.sleep(0.1)  # after the first look, before the re-check
        await leases.beat(ctx.redis, "w-blinking", 60_000, {})

    removed, _ = await asyncio.gather(reap(ctx, set()), beat_soon())
    assert removed == []
    assert exists(container)


def create_container(made: list[str], image: str, labels: dict[str, str]) -> str:
    """Created, never started: as a worker killed between a scorer's create and start
    leaves it (its `sleep` deadline never began)."""
    args = ["docker", "create", "--network", "none"]
    for key, value in labels.items():
        args += ["--label", f"{key}={value}"]
    out = subprocess.run([*args, image, "sleep", "600"], capture_output=True, text=True, check=True)
    made.append(out.stdout.strip())
    return made[-1]


async def test_a_python_scorers_container_goes_only_when_its_worker_is_gone(
    ctx: WorkerContext, docker_image: str, made: list[str]
) -> None:
    await leases.beat(ctx.redis, "w-scoring", 60_000, {})

    def scorer(worker: str) -> dict[str, str]:
        return {
            "sandhive.managed": "1",
            SCORER_LABEL: "python",
            RUN_LABEL: worker,
            INSTANCE_LABEL: ctx.instance,
            WORKER_LABEL: worker,
            CREATED_LABEL: "2026-01-01T00:00:00+00:00",
        }

    orphaned = create_container(made, docker_image, scorer("w-killed"))
    kept = {
        create_container(made, docker_image, scorer("w-scoring")): "a live worker's",
        create_container(made, docker_image, scorer(ctx.name)): "this worker's own",
    }

    removed = await reap(ctx, set())

    assert removed == [orphaned]
    assert not exists(orphaned)
    assert [why for cid, why in kept.items() if not exists(cid)] == []


async def test_a_worker_removes_the_warm_pool_its_predecessor_left_at_start(
    ctx: WorkerContext, docker_image: str, made: list[str]
) -> None:
    """The reaper leaves a live name's pool to that name, so the next worker under it
    (`remove_own_pool`, at its start) removes what the last one pooled: idle or claimed."""
    ours = {"sandhive.managed": "1", **pool_labels(ctx.instance, ctx.name)}
    left = [start_container(made, docker_image, ours) for _ in range(2)]
    another = start_container(made, docker_image, {**ours, WORKER_LABEL: "w-other"})
    for worker in (ctx.name, "w-other"):  # both alive: the reaper leaves both pools
        await leases.beat(ctx.redis, worker, 60_000, {})
    await reap(ctx, mine=())
    assert all(exists(c) for c in left), "the reaper took a live name's pool"
    removed = await remove_own_pool(ctx)
    assert sorted(removed) == sorted(left)
    assert not any(exists(c) for c in left)
    assert exists(another), "another worker's pool went too"
