"""Episode step overhead through the real service, with many episodes open at once.

    .venv/bin/python bench/episodes.py [--episodes 128] [--steps 20] [--open-concurrency 16]
                                       [--stepping K]

What a trainer that owns the loop pays per turn: a real `sandhive serve` and a real
`sandhive worker` (one, holding every sandbox), Postgres and Redis; the bench opens
--episodes episodes (`POST /v1/episodes`, --open-concurrency at a time), then drives them
all at once, --steps turns each, every turn one `execute_bash` of `true`, then a final
`submit` (timed apart: the loop ends and its sandbox goes), then closes them
(`DELETE`). --think pauses each episode that long after every answer (a trainer's model
generating its next turn); with 0 every episode steps again at once, so the figures are
queueing at the machine's throughput (Little's law: round trip ~ episodes / steps per
second), not the per-step cost; with --jitter 0 the episodes stay in step with each other
and arrive in bursts of --episodes at once, --jitter spreads each pause (real trainers'
generation times differ from episode to episode). Measured:
  * step round trip: from just before `POST /v1/episodes/{id}/step` to its answer, as the
    trainer sees it (median, p95);
  * step overhead through the API: that round trip minus the answer's `tool_ms` (the
    command's own time in the sandbox, ~all of it `docker exec` for `true`);
  * the same two figures for one episode alone (no concurrency), before the others open;
  * worker RSS per open episode: the worker's RSS with every episode open minus its RSS
    idle (after one warm-up episode), divided by --episodes;
  * memory per open episode on the host: MemAvailable before the episodes open minus after,
    divided by --episodes (the sandbox, its shim, the worker's and the API's share), and
    what each sandbox's memory cgroup is charged; from it, how many fit per GiB;
  * with --stepping K (density for RL), only K of the open episodes step at once while the
    others stay open and idle; each idle one must still close `closed` (none lost);
  * errors: any refused or failed call, and any episode not left `closed`.

Needs Postgres, Redis, Docker and the sandbox image: it creates (and drops) a scratch
database through SANDHIVE_BENCH_ADMIN_URL (default
postgresql://postgres@127.0.0.1:5432/postgres) and uses SANDHIVE_BENCH_REDIS_URL
(default redis://127.0.0.1:6379/12), which it empties before and after. The bench's
client, the API, the worker, Docker and the sandboxes share this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import (
    REDIS_URL,
    Cluster,
    bench_env,
    container_memory_mb,
    cpu_by_process,
    cpu_spent,
    labelled_containers,
    mem_available_mb,
    pct,
    rss_mb,
)
from stream_latency import create_database, drop_database, wait_ready

TRUE = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "execute_bash", "arguments": json.dumps({"command": "true"})},
        }
    ],
}


SUBMIT = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "submit", "arguments": "{}"}}
    ],
}


@dataclass
class Figures:
    """Per-step samples in seconds, by phase ("alone", "concurrent")."""

    round_trips: dict[str, list[float]] = field(default_factory=dict)
    overheads: dict[str, list[float]] = field(default_factory=dict)
    worker_ms: dict[str, list[float]] = field(default_factory=dict)
    finals: dict[str, list[float]] = field(default_factory=dict)
    """The final step's round trip (`submit`: the loop ends, its sandbox goes)."""
    opens: list[float] = field(default_factory=list)
    rss_idle_mb: float = 0.0
    rss_open_mb: float = 0.0
    host_mb_per_open: float = 0.0
    cgroup_mb_per_sandbox: float = 0.0
    open_count: int = 0
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds used during the concurrent phase, by process (see `cpu_by_process`)."""


@dataclass
class Bench:
    client: aiohttp.ClientSession
    steps: int
    think_s: float = 0.0
    """Pause after each answer before the next step: the trainer's model generating."""
    jitter: float = 0.0
    """Each pause is think_s times a uniform draw in [1 - jitter, 1 + jitter]."""
    figures: Figures = field(default_factory=Figures)

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One request: its status and JSON body ((0, why) when it never got an answer).

        aiohttp, not httpx, on the bench's side: it costs the shared cores about a third
        of httpx's CPU per request, which would otherwise be charged to the service."""
        try:
            async with self.client.request(method, path, json=body) as response:
                return response.status, await response.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return 0, repr(exc)

    async def open(self) -> str | None:
        body = {"prompt": "bench", "limits": {"max_steps": self.steps + 5, "timeout_s": 3600}}
        sent = time.monotonic()
        status, answer = await self.call("POST", "/v1/episodes", body)
        if status != 201:
            self.figures.errors.append(f"open: {status} {str(answer)[:200]}")
            return None
        self.figures.opens.append(time.monotonic() - sent)
        return str(answer["id"])

    async def drive(self, episode_id: str, phase: str) -> None:
        """`steps` turns of `true`, each timed as the trainer sees it."""
        for _ in range(self.steps):
            sent = time.monotonic()
            status, body = await self.call(
                "POST", f"/v1/episodes/{episode_id}/step", {"message": TRUE}
            )
            took = time.monotonic() - sent
            if status != 200 or body["done"]:
                self.figures.errors.append(f"step: {status} {str(body)[:200]}")
                return
            timings = body["timings"]
            self.figures.round_trips.setdefault(phase, []).append(took)
            self.figures.overheads.setdefault(phase, []).append(took - timings["tool_ms"] / 1000)
            self.figures.worker_ms.setdefault(phase, []).append(timings["worker_ms"] / 1000)
            if self.think_s:
                await asyncio.sleep(self.think_s * random.uniform(1 - self.jitter, 1 + self.jitter))
        sent = time.monotonic()
        status, body = await self.call(
            "POST", f"/v1/episodes/{episode_id}/step", {"message": SUBMIT}
        )
        if status != 200 or not body["done"]:
            self.figures.errors.append(f"final step: {status} {str(body)[:200]}")
            return
        self.figures.finals.setdefault(phase, []).append(time.monotonic() - sent)

    async def close(self, episode_id: str) -> None:
        status, body = await self.call("DELETE", f"/v1/episodes/{episode_id}")
        if status != 200 or body["status"] != "closed":
            self.figures.errors.append(f"close: {status} {str(body)[:200]}")


async def run(args: argparse.Namespace, database_url: str, log_dir: Path) -> Figures:
    redis = Redis.from_url(REDIS_URL)
    await redis.flushdb()
    env = bench_env(
        database_url,
        "http://127.0.0.1:9/v1",  # episodes never call a model
        f"bench-episodes-{os.getpid()}",
        SANDHIVE_LOG_LEVEL="WARNING",
        # Every episode open at once fits: one worker holds them all, the tenant may have them.
        SANDHIVE_EPISODE_SLOTS=str(args.episodes + 1),
        SANDHIVE_TENANT_MAX_ACTIVE_TASKS=str(max(1000, args.episodes + 1)),
        SANDHIVE_EPISODE_OPEN_TIMEOUT_S="600",
        SANDHIVE_EPISODE_STEP_TIMEOUT_S="600",
        SANDHIVE_EPISODE_IDLE_TIMEOUT_S="3600",
    )
    cluster = Cluster(env, log_dir)
    try:
        await cluster.start_api()
        await wait_ready(cluster.base_url)
        cluster.worker = cluster.spawn(["worker"], "worker", worker_name="bench-episodes")
        # Idle connections dropped well before uvicorn's 5 s keep-alive ends them: a request
        # sent on a connection the server is closing fails (a ReadError) without reaching it.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(
            base_url=cluster.base_url, connector=connector, timeout=timeout
        ) as client:
            bench = Bench(client, args.steps, args.think, args.jitter)
            await measure(bench, cluster, args)
            return bench.figures
    except Exception:
        sys.stderr.write(f"logs in {log_dir}\n")
        raise
    finally:
        cluster.stop()
        await redis.flushdb()
        await redis.aclose()


async def measure(bench: Bench, cluster: Cluster, args: argparse.Namespace) -> None:
    figures = bench.figures
    assert cluster.worker is not None
    warm = await wait_open(bench)  # the first open waits for the worker to come up
    await bench.drive(warm, "warm-up")
    await bench.close(warm)
    await bench.drive(alone := await must_open(bench), "alone")
    await bench.close(alone)
    for key in ("warm-up",):
        figures.round_trips.pop(key, None)
        figures.overheads.pop(key, None)
        figures.worker_ms.pop(key, None)
        figures.finals.pop(key, None)
    figures.opens.clear()
    await asyncio.sleep(1.0)
    figures.rss_idle_mb = rss_mb(cluster.worker.pid)
    available = mem_available_mb()

    gate = asyncio.Semaphore(args.open_concurrency)

    async def open_gated() -> str | None:
        async with gate:
            return await bench.open()

    opened = [i for i in await asyncio.gather(*(open_gated() for _ in range(args.episodes))) if i]
    figures.open_count = len(opened)
    samples = []
    for _ in range(5):
        samples.append(rss_mb(cluster.worker.pid))
        await asyncio.sleep(0.2)
    figures.rss_open_mb = statistics.median(samples)
    figures.host_mb_per_open = (available - mem_available_mb()) / max(len(opened), 1)
    sandboxes = labelled_containers(f"sandhive.instance={cluster.env['SANDHIVE_INSTANCE']}")
    charged = [container_memory_mb(c) for c in sandboxes]
    figures.cgroup_mb_per_sandbox = statistics.mean(charged) if charged else 0.0
    stepping = opened[: args.stepping or len(opened)]
    assert cluster.api is not None
    pids = {cluster.api.pid: "api", cluster.worker.pid: "worker"}
    cpu_before = cpu_by_process(pids)
    started = time.monotonic()
    await asyncio.gather(*(bench.drive(i, "concurrent") for i in stepping))
    figures.wall_s = time.monotonic() - started
    cpu_after = cpu_by_process(pids)
    figures.cpu_s = cpu_spent(cpu_before, cpu_after)
    await asyncio.gather(*(bench.close(i) for i in opened))
    for _ in range(600):  # the worker removes a closed episode's sandbox after its answer
        if not (left := await containers(cluster.env["SANDHIVE_INSTANCE"])):
            break
        await asyncio.sleep(0.2)
    if left:
        figures.errors.append(f"{len(left)} sandboxes left after every close")


async def wait_open(bench: Bench) -> str:
    for _ in range(60):
        episode_id = await bench.open()
        if episode_id is not None:
            bench.figures.errors.clear()  # 503s while the worker starts are not errors
            return episode_id
        await asyncio.sleep(1.0)
    raise RuntimeError(f"no episode opened: {bench.figures.errors[-3:]}")


async def must_open(bench: Bench) -> str:
    episode_id = await bench.open()
    if episode_id is None:
        raise RuntimeError(f"could not open: {bench.figures.errors[-1:]}")
    return episode_id


async def containers(instance: str, *labels: str) -> list[str]:
    """The containers of the service's `instance` that carry every one of `labels` too."""
    filters = [f"--filter=label={label}" for label in (f"sandhive.instance={instance}", *labels)]
    proc = await asyncio.create_subprocess_exec(
        "docker", "ps", "-aq", *filters, stdout=subprocess.PIPE
    )
    out, _ = await proc.communicate()
    return out.decode().split()


def table(figures: Figures, args: argparse.Namespace) -> str:
    rows: list[tuple[str, str, str, str]] = []

    def add(name: str, values: Sequence[float]) -> None:
        if values:
            med, p95 = statistics.median(values) * 1000, pct(values, 0.95) * 1000
            rows.append((name, f"{med:.1f}", f"{p95:.1f}", str(len(values))))

    at_once = f"{args.stepping or args.episodes} at once, think {args.think:g} s ±{args.jitter:.0%}"
    if args.stepping:
        at_once += f", {args.episodes} open"
    for phase, label in (("alone", "1 episode alone"), ("concurrent", at_once)):
        add(f"step round trip, {label} (ms)", figures.round_trips.get(phase, []))
        add(f"step overhead through the API, {label} (ms)", figures.overheads.get(phase, []))
        add(f"final step (submit) round trip, {label} (ms)", figures.finals.get(phase, []))
        add(f"  of it in the worker (worker_ms), {label} (ms)", figures.worker_ms.get(phase, []))
    add("open (POST /v1/episodes), gated (ms)", figures.opens)
    n, idle, busy = figures.open_count, figures.rss_idle_mb, figures.rss_open_mb
    rows.append(("worker RSS idle (MB)", f"{idle:.1f}", "", ""))
    rows.append((f"worker RSS with {n} episodes open (MB)", f"{busy:.1f}", "", ""))
    rows.append(("worker RSS per open episode (MB)", f"{(busy - idle) / max(n, 1):.2f}", "", ""))
    host = figures.host_mb_per_open
    rows.append(("host memory per open episode (MiB off MemAvailable)", f"{host:.1f}", "", ""))
    rows.append(
        ("  of it, its sandbox's cgroup (MiB)", f"{figures.cgroup_mb_per_sandbox:.1f}", "", "")
    )
    if host > 0:
        rows.append(("open episodes per GiB", f"{1024 / host:.0f}", "", ""))
    steps = len(figures.round_trips.get("concurrent", []))
    if figures.wall_s:
        rows.append(("concurrent steps per second", f"{steps / figures.wall_s:.0f}", "", ""))
    width = max(len(r[0]) for r in rows)
    lines = [f"{'measure':<{width}}  {'median':>8}  {'p95':>8}  {'n':>5}"]
    lines += [f"{a:<{width}}  {b:>8}  {c:>8}  {d:>5}" for a, b, c, d in rows]
    top = sorted(figures.cpu_s.items(), key=lambda kv: -kv[1])[:8]
    if steps and top:
        per_step = ", ".join(f"{name} {sec / steps * 1000:.2f}" for name, sec in top if sec > 0)
        lines.append(f"CPU ms per concurrent step, by process: {per_step}")
    lines.append(f"errors: {len(figures.errors)}")
    lines += [f"  {e}" for e in figures.errors[:10]]
    lines.append(f"load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--episodes", type=int, default=128, help="episodes open at once")
    parser.add_argument("--steps", type=int, default=20, help="turns per episode")
    parser.add_argument(
        "--think", type=float, default=0.0, help="seconds between an answer and the next step"
    )
    parser.add_argument(
        "--jitter", type=float, default=0.0, help="spread of each pause, a fraction of --think"
    )
    parser.add_argument("--open-concurrency", type=int, default=16, help="opens in flight")
    parser.add_argument(
        "--stepping", type=int, default=0, help="of the open episodes, how many step (0: all)"
    )
    args = parser.parse_args()
    name = f"sandhive_bench_{os.getpid()}"
    database_url = create_database(name)
    log_dir = Path(tempfile.mkdtemp(prefix="sandhive-bench-episodes-"))
    try:
        figures = asyncio.run(run(args, database_url, log_dir))
        if figures.errors:
            sys.stderr.write(f"logs in {log_dir}\n")
        else:
            shutil.rmtree(log_dir)  # kept when the run fails
    finally:
        asyncio.run(drop_database(name))
    sys.stdout.write(table(figures, args) + "\n")


if __name__ == "__main__":
    main()
