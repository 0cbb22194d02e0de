"""A sandbox command's overhead through the API, beside `docker exec` of the same container.

    .venv/bin/python bench/sandbox_exec.py [--runs 200]

A real `sandhive serve` and `sandhive worker`, Postgres and Redis; the bench creates one
sandbox (`POST /v1/sandboxes`), runs `true` in it --runs times one after another
(`POST …/exec`, warm: a few first runs are dropped), then runs `docker exec <container>
true` as many times on the same container, and prints medians and p95 of each and their
ratio. The API's figure includes everything a caller pays: HTTP, the API's checks, Redis to
the worker and back, the command through the sandbox's exec channel, and the command log's
Postgres write.

Needs Postgres, Redis, Docker and the sandbox image (as bench/episodes.py: a scratch
database through SANDHIVE_BENCH_ADMIN_URL, SANDHIVE_BENCH_REDIS_URL emptied before and after).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).parent))
from service import REDIS_URL, Cluster, bench_env, on_scratch_database, pct
from stream_latency import wait_ready

WARMUP = 5


async def run(runs: int, database_url: str, log_dir: Path) -> dict[str, list[float]]:
    redis = Redis.from_url(REDIS_URL)
    await redis.flushdb()
    instance = f"bench-sandbox-exec-{os.getpid()}"
    env = bench_env(database_url, "http://127.0.0.1:9/v1", instance, SANDHIVE_LOG_LEVEL="WARNING")
    cluster = Cluster(env, log_dir)
    try:
        await cluster.start_api()
        await wait_ready(cluster.base_url)
        cluster.worker = cluster.spawn(["worker"], "worker", worker_name="bench-sandbox-exec")
        async with aiohttp.ClientSession(base_url=cluster.base_url) as client:
            sandbox = await _create(client)
            api = await _through_api(client, sandbox, runs)
            container = _container(sandbox)
            docker = _docker_exec(container, runs)
            await client.delete(f"/v1/sandboxes/{sandbox}")
        return {"api": api, "docker exec": docker}
    finally:
        cluster.stop()
        await redis.flushdb()
        await redis.aclose()


async def _create(client: aiohttp.ClientSession) -> str:
    deadline = time.monotonic() + 60
    while True:  # the worker may not have said it is alive yet
        async with client.post("/v1/sandboxes", json={"ttl_s": 3600}) as response:
            body = await response.json()
            if response.status == 201:
                return str(body["id"])
        if time.monotonic() > deadline:
            raise RuntimeError(f"no sandbox: {body}")
        await asyncio.sleep(0.5)


async def _through_api(client: aiohttp.ClientSession, sandbox: str, runs: int) -> list[float]:
    times = []
    for _ in range(runs + WARMUP):
        started = time.perf_counter()
        async with client.post(f"/v1/sandboxes/{sandbox}/exec", json={"argv": ["true"]}) as r:
            done = await r.json()
        times.append((time.perf_counter() - started) * 1000)
        if done.get("exit_code") != 0:
            raise RuntimeError(f"true failed: {done}")
    return times[WARMUP:]


def _container(sandbox: str) -> str:
    found = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label=sandhive.sandbox={sandbox}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if len(found) != 1:
        raise RuntimeError(f"expected one container of {sandbox}, found {found}")
    return found[0]


def _docker_exec(container: str, runs: int) -> list[float]:
    times = []
    for _ in range(runs + WARMUP):
        started = time.perf_counter()
        subprocess.run(["docker", "exec", container, "true"], check=True)
        times.append((time.perf_counter() - started) * 1000)
    return times[WARMUP:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--runs", type=int, default=200, help="commands of each kind")
    args = parser.parse_args()
    figures = on_scratch_database(
        "sandbox-exec", lambda database_url, log_dir: run(args.runs, database_url, log_dir)
    )
    medians = {kind: statistics.median(times) for kind, times in figures.items()}
    lines = [f"`true` in a warm sandbox, {args.runs} runs each, one at a time (ms):"]
    for kind, times in figures.items():
        lines.append(f"  {kind:12} median {medians[kind]:7.2f}   p95 {pct(times, 0.95):7.2f}")
    lines.append(f"  API / docker exec: {medians['api'] / medians['docker exec']:.2f}x")
    lines.append(json.dumps({k: round(v, 2) for k, v in medians.items()}))
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
