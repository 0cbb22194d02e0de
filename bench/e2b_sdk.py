"""The E2B SDK against Sandhive: a sandbox's create → first command, and a warm command, beside
Sandhive's own API doing the same.

    .venv/bin/python bench/e2b_sdk.py [--runs 20] [--commands 100]

A real `sandhive serve` and `sandhive worker`, Postgres and Redis (as bench/sandbox_exec.py:
a scratch database through SANDHIVE_BENCH_ADMIN_URL, SANDHIVE_BENCH_REDIS_URL emptied
before and after). Each of --runs rounds makes a sandbox, runs `true` in it and removes it,
once through the `e2b` SDK (`Sandbox.create()`, `commands.run("true")`, `kill()`, pointed
at the server by E2B_API_URL and E2B_SANDBOX_URL) and once through `/v1/sandboxes`
(create, `exec`, delete); the figure is create → the first command's answer. Then
--commands warm `true`s in one sandbox each way. Needs the `e2b` extra.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).parent))
from service import REDIS_URL, Cluster, bench_env, on_scratch_database, pct
from stream_latency import wait_ready

WARMUP = 3


def through_sdk(base_url: str, runs: int, commands: int) -> tuple[list[float], list[float]]:
    from e2b import Sandbox  # the optional extra

    os.environ.update(
        E2B_API_URL=f"{base_url}/e2b",
        E2B_SANDBOX_URL=f"{base_url}/e2b/envd",
        E2B_API_KEY="bench",
        E2B_HTTP_VERSION="1.1",
    )
    starts = []
    for _ in range(runs + WARMUP):
        began = time.perf_counter()
        box = Sandbox.create(timeout=600)
        box.commands.run("true")
        starts.append((time.perf_counter() - began) * 1000)
        box.kill()
    box = Sandbox.create(timeout=600)
    warm = []
    for _ in range(commands + WARMUP):
        began = time.perf_counter()
        box.commands.run("true")
        warm.append((time.perf_counter() - began) * 1000)
    box.kill()
    return starts[WARMUP:], warm[WARMUP:]


def through_api(base_url: str, runs: int, commands: int) -> tuple[list[float], list[float]]:
    starts = []
    with httpx.Client(base_url=base_url, timeout=120) as api:
        for _ in range(runs + WARMUP):
            began = time.perf_counter()
            box = api.post("/v1/sandboxes", json={"ttl_s": 600}).json()["id"]
            api.post(f"/v1/sandboxes/{box}/exec", json={"argv": ["true"]}).raise_for_status()
            starts.append((time.perf_counter() - began) * 1000)
            api.delete(f"/v1/sandboxes/{box}")
        box = api.post("/v1/sandboxes", json={"ttl_s": 600}).json()["id"]
        warm = []
        for _ in range(commands + WARMUP):
            began = time.perf_counter()
            api.post(f"/v1/sandboxes/{box}/exec", json={"argv": ["true"]}).raise_for_status()
            warm.append((time.perf_counter() - began) * 1000)
        api.delete(f"/v1/sandboxes/{box}")
    return starts[WARMUP:], warm[WARMUP:]


async def run(runs: int, commands: int, database_url: str, log_dir: Path) -> dict[str, Any]:
    redis = Redis.from_url(REDIS_URL)
    await redis.flushdb()
    instance = f"bench-e2b-{os.getpid()}"
    env = bench_env(database_url, "http://127.0.0.1:9/v1", instance, SANDHIVE_LOG_LEVEL="WARNING")
    cluster = Cluster(env, log_dir)
    try:
        await cluster.start_api()
        await wait_ready(cluster.base_url)
        cluster.worker = cluster.spawn(["worker"], "worker", worker_name="bench-e2b")
        await _worker_ready(cluster.base_url)
        sdk = await asyncio.to_thread(through_sdk, cluster.base_url, runs, commands)
        api = await asyncio.to_thread(through_api, cluster.base_url, runs, commands)
        return {"e2b SDK": sdk, "Sandhive API": api}
    finally:
        cluster.stop()
        await redis.flushdb()
        await redis.aclose()


async def _worker_ready(base_url: str) -> None:
    """Until a sandbox can be made (the worker has said it is alive)."""
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as api:
        while True:
            made = await api.post("/v1/sandboxes", json={"ttl_s": 60})
            if made.status_code == 201:
                await api.delete(f"/v1/sandboxes/{made.json()['id']}")
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"no sandbox: {made.text}")
            await asyncio.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--runs", type=int, default=20, help="sandboxes made each way")
    parser.add_argument("--commands", type=int, default=100, help="warm commands each way")
    args = parser.parse_args()
    figures = on_scratch_database(
        "e2b", lambda database_url, log_dir: run(args.runs, args.commands, database_url, log_dir)
    )
    lines = [f"{args.runs} sandboxes and {args.commands} warm commands each way (ms):"]
    for kind, (starts, warm) in figures.items():
        lines.append(
            f"  {kind:13} create -> first command: median {statistics.median(starts):7.1f}"
            f"  p95 {pct(starts, 0.95):7.1f}   warm `true`: median"
            f" {statistics.median(warm):6.1f}  p95 {pct(warm, 0.95):6.1f}"
        )
    sdk, api = figures["e2b SDK"], figures["Sandhive API"]
    ratio = statistics.median(sdk[0]) / statistics.median(api[0])
    lines.append(f"  SDK / API, create -> first command: {ratio:.2f}x")
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
