"""What `sandbox.snapshots: steps` costs a task: the pause per step and the bytes stored.

    .venv/bin/python bench/step_snapshots.py [--tasks 3] [--steps 10] [--sizes 0,10,100]

Through the real service (`sandhive serve`, a `sandhive worker`, Postgres, Redis, Docker)
and the scripted model answering at once: for each --sizes (MB of random bytes the
task's first command writes under /testbed), --tasks tasks of --steps steps (`true` after
the first) with snapshots off and then on. Measured per step: the gap between two model
requests of a task (the step's whole overhead, its snapshot included), median and p95,
and the bytes stored per step (a step that changed no file stores none: the tar of the
step before it stands). The difference between the two
rows of a size is what a snapshot costs a step.

Needs Postgres, Redis, Docker and the sandbox image, as bench/service.py.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
from pathlib import Path

import httpx
from redis.asyncio import Redis
from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import (
    REDIS_URL,
    Bench,
    Cluster,
    ScriptedLLMProcess,
    bench_env,
    on_scratch_database,
    pct,
)

from app.db import models
from app.db.engine import create_engine, create_sessions
from app.scripted import Turn


async def one_task(bench: Bench, size_mb: int, steps: int, snapshots: str) -> list[float]:
    """The gaps between the task's model requests (ms)."""
    write = f"head -c {size_mb}M /dev/urandom > /testbed/blob.bin" if size_mb else "true"
    turns = [Turn(tool="execute_bash", arguments={"command": write})]
    turns += [Turn(tool="execute_bash", arguments={"command": "true"})] * (steps - 2)
    model = bench.script([*turns, Turn(tool="submit")])
    body = {
        "prompt": "bench",
        "llm": {"model": model},
        "limits": {"max_steps": steps + 2},
        "sandbox": {"snapshots": snapshots, "disk_mb": max(256, size_mb * 2)},
    }
    response = await bench.client.post("/v1/tasks", json=body)
    response.raise_for_status()
    status = await bench.follow(str(response.json()["id"]), record=False)
    if status != "succeeded":
        raise RuntimeError(f"a bench task ended {status}")
    arrivals = bench.llm.arrivals(model)
    return [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)][1:]  # after the write


async def stored_per_step(database_url: str) -> float:
    engine = create_engine(database_url)
    try:
        async with create_sessions(engine)() as session:
            total, count = (
                await session.execute(
                    select(
                        func.sum(func.coalesce(func.octet_length(models.StepSnapshot.archive), 0)),
                        func.count(),
                    )
                )
            ).one()
            await session.execute(models.StepSnapshot.__table__.delete())
            await session.commit()
    finally:
        await engine.dispose()
    return float(total or 0) / max(int(count), 1)


async def run(args: argparse.Namespace, database_url: str, log_dir: Path) -> list[str]:
    redis = Redis.from_url(REDIS_URL)
    await redis.flushdb()
    lines = []
    with ScriptedLLMProcess() as llm:
        env = bench_env(database_url, llm.base_url, f"bench-{os.getpid()}")
        cluster = Cluster(env, log_dir)
        try:
            await cluster.start_api()
            async with httpx.AsyncClient(base_url=cluster.base_url, timeout=60) as client:
                bench = Bench(cluster, llm, client)
                cluster.start_worker("bench-snapshots", concurrency=2, pool=0)
                await bench.warm_up()
                for size in args.sizes:
                    for mode in ("off", "steps"):
                        gaps: list[float] = []
                        for _ in range(args.tasks):
                            gaps += await one_task(bench, size, args.steps, mode)
                        stored = await stored_per_step(database_url)
                        lines.append(
                            f"{size:4} MB, snapshots {mode:5}: step p50"
                            f" {statistics.median(gaps):7.1f} ms  p95 {pct(gaps, 0.95):7.1f}"
                            f"   stored per step {stored / 2**20:7.2f} MiB"
                        )
        finally:
            cluster.stop()
            await redis.flushdb()
            await redis.aclose()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--tasks", type=int, default=3, help="tasks per size and mode")
    parser.add_argument("--steps", type=int, default=10, help="steps per task")
    parser.add_argument("--sizes", default="0,10,100", help="MB the first command writes")
    args = parser.parse_args()
    args.sizes = [int(size) for size in args.sizes.split(",")]
    lines = on_scratch_database("snapshots", lambda url, logs: run(args, url, logs))
    lines.append(f"{os.cpu_count()} CPUs, load average now {os.getloadavg()[0]:.1f}")
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
