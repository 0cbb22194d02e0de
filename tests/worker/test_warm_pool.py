"""Warm-pool sandboxes and the reaper: a live worker's pool stays, a dead worker's pool goes.

Pooled containers carry no task label (the task is not known when they start), so
the reaper must judge them by their worker alone.
"""

from __future__ import annotations

import subprocess

from app.bus import leases
from app.sandbox.pool import pool_labels
from app.worker.context import WorkerContext
from app.worker.reaping import reap


def start_pooled(made: list[str], image: str, instance: str, worker: str) -> str:
    labels = {"sandhive.managed": "1", **pool_labels(instance, worker)}
    args = ["docker", "run", "-d", "--network", "none"]
    for key, value in labels.items():
        args += ["--label", f"{key}={value}"]
    out = subprocess.run([*args, image, "sleep", "600"], capture_output=True, text=True, check=True)
    made.append(out.stdout.strip())
    return made[-1]


def exists(container_id: str) -> bool:
    probe = subprocess.run(["docker", "inspect", container_id], capture_output=True, check=False)
    return probe.returncode == 0


async def test_reaper_keeps_live_pools_and_removes_dead_ones(
    ctx: WorkerContext, docker_image: str, made: list[str]
) -> None:
    await leases.beat(ctx.redis, "w-alive", 60_000, {})
    own = start_pooled(made, docker_image, ctx.instance, "w-me")
    alive = start_pooled(made, docker_image, ctx.instance, "w-alive")
    dead = start_pooled(made, docker_image, ctx.instance, "w-dead")

    removed = await reap(ctx, set())

    assert removed == [dead]
    assert not exists(dead)
    assert exists(own), "this worker's own pool"
    assert exists(alive), "a live worker's pool, though it has no task"
