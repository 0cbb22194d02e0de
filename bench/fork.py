"""Fork latency: an open episode with 1 MB, 100 MB or 1 GB of files forked into 1, 8, 32.

    .venv/bin/python bench/fork.py [--sizes 1,100,1024] [--children 1,8,32] [--repeats 5]

Through the real service (`sandhive serve`, one `sandhive worker` holding every sandbox,
Postgres, Redis, Docker): for each size, a parent episode writes that many MB of random
bytes under /testbed, then is forked --repeats times into each --children count
(`POST /v1/episodes/{id}/fork`); the children are closed, and their sandboxes gone,
before the next fork. Measured per fork, from the request to its answer (every child
open, its first messages in hand): p50 and p95, and the worker's own split (`snapshot_ms`:
the parent's pause for the tar; the rest: the children's sandboxes made and the tar
unpacked into each). Beside them, a fresh episode's open (`POST /v1/episodes`) on the
same service. A size whose children would not fit in this machine's memory (the files
are tmpfs: RAM) is skipped and said so.

Needs Postgres, Redis, Docker and the sandbox image, as bench/episodes.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from episodes import TRUE, containers
from service import REDIS_URL, Cluster, bench_env, on_scratch_database, pct
from stream_latency import wait_ready

MEMORY_SHARE = 0.6
"""The most of this machine's RAM the children's files may take (a 1 GB parent forked into
32 needs 32 GB of tmpfs)."""


def bash(command: str) -> dict[str, Any]:
    call = TRUE["tool_calls"][0]
    arguments = json.dumps({"command": command})
    return {
        **TRUE,
        "tool_calls": [{**call, "function": {**call["function"], "arguments": arguments}}],
    }


class Bench:
    def __init__(
        self, client: aiohttp.ClientSession, instance: str, pool: int, disk_mb: int
    ) -> None:
        self.client, self.instance, self.pool, self.disk_mb = client, instance, pool, disk_mb

    async def call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        async with self.client.request(method, path, json=body) as response:
            answer: dict[str, Any] = await response.json()
            if response.status >= 400:
                raise RuntimeError(f"{method} {path}: {response.status} {answer}")
            return answer

    async def open(self) -> tuple[str, float]:
        """An episode of the run's one shape (a warm pool keeps one pool per shape)."""
        sandbox = {"disk_mb": self.disk_mb}
        body = {"prompt": "fork bench", "sandbox": sandbox, "limits": {"max_steps": 50}}
        started = time.monotonic()
        opened = await self.call("POST", "/v1/episodes", body)
        return opened["id"], time.monotonic() - started

    async def step(self, episode: str, command: str) -> None:
        answer = await self.call("POST", f"/v1/episodes/{episode}/step", {"message": bash(command)})
        content = answer["messages"][0]["content"]
        if not content.startswith("Exit code: 0"):
            raise RuntimeError(f"{command!r} failed: {content[:300]}")

    async def fork(self, parent: str, n: int) -> tuple[float, dict[str, int], list[str]]:
        started = time.monotonic()
        forked = await self.call("POST", f"/v1/episodes/{parent}/fork", {"n": n})
        took = time.monotonic() - started
        children = [child["id"] for child in forked["children"]]
        if any(child["status"] != "open" for child in forked["children"]):
            raise RuntimeError(f"a child did not start: {forked['children']}")
        return took, forked["timings"], children

    async def close(self, episodes: list[str], keep: int) -> None:
        """Close them; back once their sandboxes are gone and a warm pool is full again (a
        claimed pooled sandbox keeps the pool's labels: only the total tells)."""
        await asyncio.gather(*(self.call("DELETE", f"/v1/episodes/{e}") for e in episodes))
        for _ in range(1200):
            if len(await containers(self.instance)) == keep + self.pool:
                return
            await asyncio.sleep(0.1)
        raise RuntimeError("the closed episodes' sandboxes were not removed in 120 s")


def disk_mb(sizes: list[int]) -> int:
    """The workdir every episode of the run gets: room for the largest size (a tmpfs: only
    what is written takes memory)."""
    return max(sizes) * 5 // 4 + 64


def fits(size_mb: int, n: int) -> bool:
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    return size_mb * (n + 1) * 1.1 <= memory_mb * MEMORY_SHARE


async def run(args: argparse.Namespace, database_url: str, log_dir: Path) -> list[str]:
    redis = Redis.from_url(REDIS_URL)
    await redis.flushdb()
    most = max(args.children)
    instance = f"bench-fork-{os.getpid()}"
    settings = dict(
        SANDHIVE_LOG_LEVEL="WARNING",
        SANDHIVE_EPISODE_SLOTS=str(4 * most + 4),  # closed children hold slots until removed
        SANDHIVE_TENANT_MAX_ACTIVE_TASKS="1000",
        SANDHIVE_FORK_MAX_SNAPSHOT_MB=str(max(args.sizes) * 2),
        SANDHIVE_MAX_DISK_MB=str(max(8192, disk_mb(args.sizes))),
        SANDHIVE_EPISODE_OPEN_TIMEOUT_S="600",
        SANDHIVE_EPISODE_STEP_TIMEOUT_S="600",
        SANDHIVE_FORK_TIMEOUT_S="900",
    )
    settings.update(setting.split("=", 1) for setting in args.env)
    # Episodes never call a model.
    env = bench_env(database_url, "http://127.0.0.1:9/v1", instance, **settings)
    cluster = Cluster(env, log_dir)
    lines: list[str] = []
    try:
        await cluster.start_api()
        await wait_ready(cluster.base_url)
        cluster.worker = cluster.spawn(["worker"], "worker", worker_name="bench-fork")
        timeout = aiohttp.ClientTimeout(total=900)
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)
        async with aiohttp.ClientSession(
            base_url=cluster.base_url, connector=connector, timeout=timeout
        ) as client:
            pool = int(env.get("SANDHIVE_WARM_POOL_SIZE", "0"))
            bench = Bench(client, instance, pool, disk_mb(args.sizes))
            lines += await fresh_opens(bench, args.repeats)
            for size in args.sizes:
                lines += await one_size(bench, size, args)
    finally:
        cluster.stop()
        await redis.flushdb()
        await redis.aclose()
    return lines


async def fresh_opens(bench: Bench, repeats: int) -> list[str]:
    """A fresh episode's open, for comparison (the first waits for the worker: dropped)."""
    for attempt in range(300):
        try:
            first, _ = await bench.open()
            break
        except RuntimeError as exc:  # 503 until the worker's heartbeat is in
            if attempt == 299 or "503" not in str(exc):
                raise
            await asyncio.sleep(0.2)
    await bench.close([first], keep=0)
    times = []
    for _ in range(repeats):
        episode, took = await bench.open()
        times.append(took * 1000)
        await bench.close([episode], keep=0)
    return [
        f"fresh episode open: p50 {statistics.median(times):7.0f} ms  p95 {pct(times, 0.95):7.0f}"
    ]


async def one_size(bench: Bench, size_mb: int, args: argparse.Namespace) -> list[str]:
    parent, _ = await bench.open()
    await bench.step(parent, f"head -c {size_mb}M /dev/urandom > /testbed/blob.bin")
    lines = []
    for n in args.children:
        if not fits(size_mb, n):
            lines.append(
                f"{size_mb:5} MB into {n:2}: skipped (would not fit in this machine's RAM)"
            )
            continue
        walls, snaps, workers, sizes = [], [], [], []
        for _ in range(args.repeats):
            took, timings, children = await bench.fork(parent, n)
            walls.append(took * 1000)
            snaps.append(timings["snapshot_ms"])
            workers.append(timings["worker_ms"])
            sizes.append(timings["snapshot_bytes"])
            await bench.close(children, keep=1)
        starts = [whole - snap for whole, snap in zip(workers, snaps, strict=True)]
        lines.append(
            f"{size_mb:5} MB into {n:2}: p50 {statistics.median(walls):7.0f} ms"
            f"  p95 {pct(walls, 0.95):7.0f}   snapshot p50 {statistics.median(snaps):6.0f} ms"
            f"  children p50 {statistics.median(starts):6.0f} ms"
            f"  tar {sizes[0] / 2**20:7.1f} MiB"
        )
    await bench.close([parent], keep=0)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--sizes", default="1,100,1024", help="MB of files in the parent")
    parser.add_argument("--children", default="1,8,32", help="children per fork")
    parser.add_argument("--repeats", type=int, default=5, help="forks per size and count")
    parser.add_argument("--env", action="append", default=[], help="SANDHIVE_X=VALUE for both")
    args = parser.parse_args()
    args.sizes = [int(size) for size in args.sizes.split(",")]
    args.children = [int(n) for n in args.children.split(",")]
    lines = on_scratch_database("fork", lambda url, logs: run(args, url, logs))
    lines.append(f"{os.cpu_count()} CPUs, load average now {os.getloadavg()[0]:.1f}")
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
