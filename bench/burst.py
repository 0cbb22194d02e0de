"""Sandboxes made at once, in the manner of the public sandbox benchmarks: from the request to
a sandbox that has run a command.

    .venv/bin/python bench/burst.py [--burst 100] [--sequential 10] [--settle 2] [--pool N]
        [--env SANDHIVE_X=VALUE ...]

A real `sandhive serve` and `sandhive worker`, Postgres and Redis (as bench/sandbox_exec.py).
First `--sequential` sandboxes one after another (time to interactive alone), then `--burst`
all at once. Each is `POST /v1/sandboxes` then `POST …/exec` of `true`, timed from the create
request's start to the command's answer; a sandbox whose create or command failed counts
against the success rate. All are removed afterwards. Prints p50 / p95 / p99 and the success
rate of each phase, and the load average.

`--pool N` gives the worker N warm sandboxes (`SANDHIVE_SANDBOX_WARM_POOL_SIZE`), filled before
the first phase, and prints what they cost while they wait: the memory their cgroups are
charged, the host's MemAvailable before and after they started (with the shims and the
daemon's share), and the machine's busy CPU over 10 idle seconds against the same with none.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).parent))
from service import (
    REDIS_URL,
    Cluster,
    bench_env,
    busy_seconds,
    container_memory_mb,
    cpu_by_process,
    cpu_spent,
    labelled_containers,
    mem_available_mb,
    on_scratch_database,
    pct,
)
from stream_latency import wait_ready


async def one(client: aiohttp.ClientSession, made: list[str]) -> float | None:
    """Seconds from the create request to `true`'s answer; None when either failed."""
    started = time.perf_counter()
    async with client.post("/v1/sandboxes", json={"ttl_s": 600}) as response:
        body = await response.json()
    if response.status != 201:
        sys.stderr.write(f"create: {response.status} {str(body)[:200]}\n")
        return None
    made.append(str(body["id"]))
    async with client.post(f"/v1/sandboxes/{body['id']}/exec", json={"argv": ["true"]}) as r:
        done = await r.json()
    if r.status != 200 or done.get("exit_code") != 0:
        sys.stderr.write(f"exec: {r.status} {str(done)[:200]}\n")
        return None
    return time.perf_counter() - started


async def ready(client: aiohttp.ClientSession) -> None:
    """Until the worker takes sandboxes (its first heartbeat)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        made: list[str] = []
        took = await one(client, made)
        await remove(client, made)
        if took is not None:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError("the worker never made a sandbox")


async def remove(client: aiohttp.ClientSession, made: list[str]) -> None:
    async def gone(sandbox: str) -> None:
        async with client.delete(f"/v1/sandboxes/{sandbox}") as response:
            await response.read()

    await asyncio.gather(*(gone(s) for s in made))
    made.clear()


IDLE_S = 10.0


def idle_cpu_percent() -> float:
    """The machine's busy share of one core over `IDLE_S` seconds of nothing asked."""
    before = busy_seconds()
    time.sleep(IDLE_S)
    return 100 * (busy_seconds() - before) / IDLE_S


async def fill(instance: str, size: int, costs: dict[str, Any]) -> None:
    """Until the worker's pool holds `size` sandboxes; what they cost into `costs`."""
    deadline = time.monotonic() + 30 + size * 2.0
    while (
        len(ids := labelled_containers(f"sandhive.instance={instance}", "sandhive.pool=1")) < size
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the warm pool reached {len(ids)} of {size} sandboxes")
        await asyncio.sleep(0.5)
    await asyncio.sleep(2)  # their channel agents settled
    costs["cgroup_mb"] = sum(container_memory_mb(c) for c in ids) / len(ids)
    costs["idle_cpu_pct"] = await asyncio.to_thread(idle_cpu_percent)


async def run(args: argparse.Namespace, database_url: str, log_dir: Path) -> dict[str, Any]:
    redis = Redis.from_url(REDIS_URL)
    await redis.flushdb()
    instance = f"bench-burst-{os.getpid()}"
    extra = dict(pair.split("=", 1) for pair in args.env)
    env = bench_env(
        database_url,
        "http://127.0.0.1:9/v1",
        instance,
        SANDHIVE_LOG_LEVEL="WARNING",
        SANDHIVE_TENANT_MAX_SANDBOXES=str(args.burst + 8),
        SANDHIVE_SANDBOX_WORKER_MAX_CONCURRENT_REQUESTS=str(args.burst + 8),
        SANDHIVE_SANDBOX_MAX_CONCURRENT_REQUESTS=str(args.burst + 8),
        SANDHIVE_SANDBOX_SLOTS=str(args.burst + args.pool + 8),
        SANDHIVE_SANDBOX_WARM_POOL_SIZE=str(args.pool),
        **extra,
    )
    cluster = Cluster(env, log_dir)
    timeout = aiohttp.ClientTimeout(total=600)
    costs: dict[str, Any] = {}
    """What the run cost: the burst's CPU by process, and the warm pool's while it waits."""
    try:
        await cluster.start_api()
        await wait_ready(cluster.base_url)
        costs["idle_cpu_none_pct"] = await asyncio.to_thread(idle_cpu_percent)
        available = mem_available_mb()
        cluster.worker = cluster.spawn(["worker"], "worker", worker_name="bench-burst")
        async with aiohttp.ClientSession(base_url=cluster.base_url, timeout=timeout) as client:
            if args.pool:
                await fill(instance, args.pool, costs)
                costs["host_mb"] = (available - mem_available_mb()) / args.pool
            await ready(client)
            made: list[str] = []
            sequential = []
            for _ in range(args.sequential):
                sequential.append(await one(client, made))
                await remove(client, made)
            await asyncio.sleep(args.settle)  # removals done (and a warm pool filled)
            assert cluster.api is not None
            assert cluster.worker is not None
            roles = {cluster.api.pid: "API", cluster.worker.pid: "worker"}
            cpu, busy = cpu_by_process(roles), busy_seconds()
            burst = await asyncio.gather(*(one(client, made) for _ in range(args.burst)))
            spent = cpu_spent(cpu, cpu_by_process(roles))
            costs["cpu"] = {"machine": busy_seconds() - busy, **spent}
            await remove(client, made)
        return {"sequential": sequential, "burst": burst, "costs": costs}
    finally:
        cluster.stop()
        await redis.flushdb()
        await redis.aclose()


def line(name: str, results: list[float | None]) -> str:
    ok = [r * 1000 for r in results if r is not None]
    rate = 100 * len(ok) / len(results) if results else 0.0
    if not ok:
        return f"  {name:11} none succeeded of {len(results)}"
    return (
        f"  {name:11} p50 {pct(ok, 0.5):7.0f}   p95 {pct(ok, 0.95):7.0f}   "
        f"p99 {pct(ok, 0.99):7.0f}   success {rate:5.1f} % of {len(results)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--burst", type=int, default=100, help="sandboxes made at once")
    parser.add_argument("--sequential", type=int, default=10, help="made one at a time first")
    parser.add_argument("--env", action="append", default=[], help="SANDHIVE_X=VALUE for both")
    parser.add_argument(
        "--settle", type=float, default=2.0, help="seconds before the burst (a warm pool fills)"
    )
    parser.add_argument("--pool", type=int, default=0, help="warm sandboxes, filled first")
    args = parser.parse_args()
    figures = on_scratch_database(
        "burst", lambda database_url, log_dir: run(args, database_url, log_dir)
    )
    costs = figures.pop("costs")
    out = ["request -> a sandbox that ran `true` (ms):"]
    out += [line(phase, results) for phase, results in figures.items()]
    cpu = costs["cpu"]
    top = sorted(((v, k) for k, v in cpu.items() if k != "machine" and v >= 0.05), reverse=True)
    out.append(
        f"  the burst's CPU-s: machine {cpu['machine']:.2f};"
        + ", ".join(f" {name} {used:.2f}" for used, name in top[:8])
    )
    if args.pool:
        out.append(
            f"  warm pool of {args.pool}: {costs['cgroup_mb']:.1f} MiB each in its cgroup,"
            f" {costs['host_mb']:.1f} MiB each off MemAvailable; machine idle CPU"
            f" {costs['idle_cpu_pct']:.1f} % of a core (none: {costs['idle_cpu_none_pct']:.1f} %)"
        )
    out.append(f"  {os.cpu_count()} CPUs, load average now {os.getloadavg()[0]:.1f}")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
