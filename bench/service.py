"""Sandhive's overhead through the real service: API and worker processes, Postgres, Redis.

    .venv/bin/python bench/service.py [--tasks 10] [--steps 10] [--latency 0.5]
                                      [--latency-tasks 2] [--running 8]

Where bench/overhead.py times the episode path in-process, this one goes through
everything a user's task goes through: `POST /v1/tasks` on a real `sandhive
serve`, the Redis queue, a real `sandhive worker` (sandbox, agent loop, one
Postgres transaction per step, live events), and a WebSocket follower. The
model is the scripted LLM server (in a process of its own, answering instantly unless
--latency), which notes when each request arrives. Measured, one task at a time:
  * submit -> first LLM request: from just before `POST /v1/tasks` to the
    model receiving the task's first request (median, p95), cold
    (SANDHIVE_WARM_POOL_SIZE=0) and warm (pool of 2, filled before each submit);
  * per-step overhead: time between consecutive LLM requests of a task minus the
    model's latency, the command being `true` (so ~0 of it is the command);
  * step -> WebSocket: from the end of a step (its `started_at` + `llm_ms` +
    `tool_ms`, ms precision) to a WebSocket follower receiving `step.completed`;
  * worker memory per running task: the worker process's RSS with --running
    tasks mid-way (their commands `sleep 0.5`) minus its RSS idle, divided by N.

Needs Postgres, Redis, Docker and the sandbox image: it creates (and drops) a
scratch database through SANDHIVE_BENCH_ADMIN_URL (default
postgresql://postgres@127.0.0.1:5432/postgres) and uses SANDHIVE_BENCH_REDIS_URL
(default redis://127.0.0.1:6379/12), which it empties before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

import httpx
import websockets
from redis.asyncio import Redis

from app.scripted import Script, ScriptedLLMServer, Turn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stream_latency import create_database, drop_database, free_port, wait_ready

T = TypeVar("T")

REDIS_URL = os.environ.get("SANDHIVE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
IMAGE = os.environ.get("SANDHIVE_BENCH_IMAGE", "sandhive-sandbox:latest")
WARM_POOL = 2


@dataclass
class Figures:
    """What the runs measured, in seconds."""

    starts: dict[str, list[float]] = field(default_factory=dict)
    gaps: dict[str, list[float]] = field(default_factory=dict)
    to_ws: list[float] = field(default_factory=list)
    rss_idle_mb: float = 0.0
    rss_busy_mb: float = 0.0
    running: int = 0
    sandbox_starts: dict[str, list[float]] = field(default_factory=dict)
    """phase/source -> [count, sum of seconds] of the worker's sandbox starts."""
    errors: int = 0


@dataclass
class Cluster:
    """The API and the worker processes of the run, on a scratch database."""

    env: dict[str, str]
    log_dir: Path
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    api: subprocess.Popen[bytes] | None = None
    worker: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self, args: list[str], name: str, **settings: str) -> subprocess.Popen[bytes]:
        env = {**self.env, **{f"SANDHIVE_{k.upper()}": v for k, v in settings.items()}}
        with (self.log_dir / f"{name}.log").open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "app", *args], env=env, stdout=out, stderr=subprocess.STDOUT
            )

    async def start_api(self) -> None:
        self.api = self.spawn(["serve", "--port", str(self.port)], "api")
        await wait_ready(self.base_url)

    def start_worker(self, name: str, *, concurrency: int, pool: int) -> None:
        self.worker = self.spawn(
            ["worker"],
            name,
            worker_name=name,
            worker_concurrency=str(concurrency),
            warm_pool_size=str(pool),
            worker_metrics_port=str(self.metrics_port),
        )

    def check_alive(self) -> None:
        """RuntimeError, with the end of its log, when the API or the worker has exited: a
        bench waiting for tasks would otherwise wait for ever."""
        for name, proc in (("api", self.api), ("worker", self.worker)):
            if proc is not None and proc.poll() is not None:
                logs = sorted(self.log_dir.glob("*.log"), key=lambda p: p.stat().st_mtime)
                tail = logs[-1].read_text(errors="replace")[-3000:] if logs else ""
                raise RuntimeError(f"the {name} exited ({proc.returncode}):\n{tail}")

    def stop_worker(self) -> None:
        if self.worker is not None:
            self.worker.terminate()
            self.worker.wait(timeout=60)
            self.worker = None

    def stop(self) -> None:
        self.stop_worker()
        if self.api is not None:
            self.api.terminate()
            self.api.wait(timeout=30)


class ScriptedLLMProcess:
    """The scripted LLM server in a process of its own, driven over a pipe.

    In this process's own thread its requests waited on the GIL while the bench's
    WebSocket follower and polling ran (Python hands the GIL over every 5 ms), which
    added ~10 ms per model call that is neither the model's nor Sandhive's.
    Arrival times are `time.monotonic()`, the same clock in every process.
    """

    def __init__(self) -> None:
        self._conn, child = multiprocessing.Pipe()
        self._proc = multiprocessing.get_context("spawn").Process(
            target=_serve_scripted, args=(child,), daemon=True
        )
        self._proc.start()
        self.base_url: str = self._conn.recv()

    def add_script(self, model: str, script: Script) -> None:
        self._call("add_script", model, script)

    def arrivals(self, model: str) -> list[float]:
        return list(self._call("arrivals", model))

    def _call(self, *request: object) -> Any:
        self._conn.send(request)
        return self._conn.recv()

    def __enter__(self) -> ScriptedLLMProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.send(("stop",))
        self._proc.join(timeout=10)


def _serve_scripted(conn: Connection) -> None:
    with ScriptedLLMServer() as server:
        conn.send(server.base_url)
        while (request := conn.recv())[0] != "stop":
            name, *args = request
            conn.send(getattr(server, name)(*args))


@dataclass
class Bench:
    cluster: Cluster
    llm: ScriptedLLMProcess
    client: httpx.AsyncClient
    figures: Figures = field(default_factory=Figures)
    count: int = 0

    def script(self, turns: Sequence[Turn]) -> str:
        self.count += 1
        model = f"bench-{self.count}"
        self.llm.add_script(model, Script(turns=list(turns)))
        return model

    async def submit(self, model: str, steps: int) -> tuple[str, float]:
        body = {"prompt": "bench", "llm": {"model": model}, "limits": {"max_steps": steps + 2}}
        sent = time.monotonic()
        response = await self.client.post("/v1/tasks", json=body)
        response.raise_for_status()
        return str(response.json()["id"]), sent

    async def warm_up(self) -> None:
        """A task whose figures are dropped."""
        to_ws = list(self.figures.to_ws)
        await self.one_task("warm-up", 2)
        self.figures.starts.pop("warm-up")
        self.figures.gaps.pop("warm-up, model latency 0 s")
        self.figures.to_ws = to_ws

    async def one_task(self, label: str, steps: int, latency: float = 0.0) -> None:
        """Run a task of `steps` turns (`true`, then submit) and note its figures."""
        turns = [Turn(tool="execute_bash", arguments={"command": "true"}, delay_s=latency)] * (
            steps - 1
        )
        model = self.script([*turns, Turn(tool="submit", delay_s=latency)])
        task_id, sent = await self.submit(model, steps)
        status = await self.follow(task_id, record=latency == 0)
        self.figures.errors += status != "succeeded"
        arrivals = self.llm.arrivals(model)
        self.figures.starts.setdefault(label, []).append(arrivals[0] - sent)
        gaps = [b - a - latency for a, b in itertools.pairwise(arrivals)]
        self.figures.gaps.setdefault(f"{label}, model latency {latency:g} s", []).extend(gaps)

    async def follow(self, task_id: str, *, record: bool) -> str:
        """Follow the task's WebSocket to its end; note step-to-viewer latencies."""
        url = self.cluster.base_url.replace("http://", "ws://")
        async with websockets.connect(f"{url}/v1/tasks/{task_id}/stream?after=0") as ws:
            async for message in ws:
                arrived = time.time()
                event = json.loads(message)
                if event["type"] == "step.completed" and record:
                    data = event["data"]
                    started = datetime.fromisoformat(data["started_at"]).timestamp()
                    ended = started + (data["llm_ms"] + data["tool_ms"]) / 1000
                    self.figures.to_ws.append(arrived - ended)
                elif event["type"] == "task.finished":
                    return str(event["data"]["status"])
        return "unknown"

    async def memory_per_task(self, n: int) -> None:
        """Worker RSS idle, then with n tasks mid-way through sleeping steps."""
        worker = self.cluster.worker
        assert worker is not None
        await asyncio.sleep(1.0)
        self.figures.rss_idle_mb = rss_mb(worker.pid)
        turns = [Turn(tool="execute_bash", arguments={"command": "sleep 0.5"})] * 8
        models = [self.script([*turns, Turn(tool="submit")]) for _ in range(n)]
        ids = [(await self.submit(model, 9))[0] for model in models]
        for _ in range(1200):  # until every task is past its second step
            if min(len(self.llm.arrivals(m)) for m in models) >= 3:
                break
            await asyncio.sleep(0.05)
        samples = []
        for _ in range(5):
            samples.append(rss_mb(worker.pid))
            await asyncio.sleep(0.2)
        self.figures.rss_busy_mb = statistics.median(samples)
        self.figures.running = n
        statuses = await asyncio.gather(*(self.follow(task_id, record=False) for task_id in ids))
        self.figures.errors += sum(status != "succeeded" for status in statuses)

    async def wait_pool_filled(self, instance: str) -> None:
        """Until the instance's only sandboxes are WARM_POOL running ones (the pool, full)."""
        for _ in range(600):
            states = await sandbox_states(instance)
            if states == ["running"] * WARM_POOL:
                await asyncio.sleep(0.3)  # the last one's readiness check, after `running`
                return
            await asyncio.sleep(0.1)
        raise RuntimeError("the warm pool did not fill")

    async def note_sandbox_starts(self, phase: str) -> None:
        """The worker's own sandbox-start histogram (count, sum) by source, from /metrics."""
        url = f"http://127.0.0.1:{self.cluster.metrics_port}/metrics"
        async with httpx.AsyncClient(timeout=5) as client:
            text = (await client.get(url)).text
        prefix = "sandhive_worker_sandbox_start_seconds_"
        for line in text.splitlines():
            for part in ("count", "sum"):
                if line.startswith(f"{prefix}{part}{{"):
                    source = line.split('source="', 1)[1].split('"', 1)[0]
                    figure = self.figures.sandbox_starts.setdefault(f"{phase}/{source}", [0, 0])
                    figure[part == "sum"] = float(line.rsplit(" ", 1)[1])


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def mem_available_mb() -> float:
    """The host's MemAvailable: what a new container can still have."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def container_memory_mb(container_id: str) -> float:
    """What the container's memory cgroup charges it now (its processes and its tmpfs files),
    cgroup v1 or v2 with the cgroupfs driver; 0 when the cgroup is not found."""
    for path in (
        f"/sys/fs/cgroup/memory/docker/{container_id}/memory.usage_in_bytes",
        f"/sys/fs/cgroup/docker/{container_id}/memory.current",
    ):
        if os.path.exists(path):
            with open(path) as usage:
                return int(usage.read()) / 2**20
    return 0.0


def cpu_by_process(pids: dict[int, str]) -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of every process now, by pid with its role: the API, the
    worker and this bench by role, the rest (postgres, redis-server, dockerd, the
    sandboxes' processes ...) by command name, the kernel's work-queue threads as one
    (a kworker's name says what it does at this instant, not over a phase)."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = {**pids, os.getpid(): "bench client"}
    used: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name.startswith("kworker/"):
            name = "kworker (kernel work queues)"
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry.name)
        used[pid] = (pids.get(pid, name), (int(fields[11]) + int(fields[12])) / tick)
    return used


def cpu_spent(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds between two `cpu_by_process` readings, summed by role: each process's own
    difference (one started between them counts whole; one that exited is not seen)."""
    spent: dict[str, float] = {}
    for pid, (role, seconds) in after.items():
        spent[role] = spent.get(role, 0.0) + seconds - before.get(pid, (role, 0.0))[1]
    return spent


def busy_seconds() -> float:
    """The machine's CPU-seconds not idle since boot, all cores (/proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def labelled_containers(*labels: str) -> list[str]:
    """Full ids of the running containers carrying every `key=value` of `labels`."""
    found = subprocess.run(
        ["docker", "ps", "-q", "--no-trunc", *(f"--filter=label={lab}" for lab in labels)],
        capture_output=True,
        text=True,
        check=True,
    )
    return found.stdout.split()


async def sandbox_states(instance: str) -> list[str]:
    """The state of every container of this run (a finished task's sandbox is gone)."""
    proc = await asyncio.create_subprocess_exec(
        *("docker", "ps", "-a", "--filter", f"label=sandhive.instance={instance}"),
        *("--format", "{{.State}}"),
        stdout=subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    return out.decode().split()


async def run(args: argparse.Namespace, database_url: str, log_dir: Path) -> Figures:
    redis = Redis.from_url(REDIS_URL)
    await redis.flushdb()
    instance = f"bench-{os.getpid()}"
    with ScriptedLLMProcess() as llm:
        env = bench_env(database_url, llm.base_url, instance)
        cluster = Cluster(env, log_dir)
        try:
            await cluster.start_api()
            async with httpx.AsyncClient(base_url=cluster.base_url, timeout=30) as client:
                bench = Bench(cluster, llm, client)
                cluster.start_worker("bench-cold", concurrency=max(2, args.running), pool=0)
                await bench.warm_up()  # imports, image cache, connections
                for _ in range(args.tasks):
                    await bench.one_task("cold", args.steps)
                for _ in range(args.latency_tasks):
                    await bench.one_task("cold", args.steps, args.latency)
                await bench.memory_per_task(args.running)
                await bench.note_sandbox_starts("no pool")
                cluster.stop_worker()
                cluster.start_worker("bench-warm", concurrency=WARM_POOL, pool=WARM_POOL)
                await bench.warm_up()  # a shape's pool starts with its first (cold) task
                for _ in range(args.tasks):
                    await bench.wait_pool_filled(instance)
                    await bench.one_task("warm", args.steps)
                await bench.note_sandbox_starts("pool")
                return bench.figures
        except Exception:
            sys.stderr.write(f"logs in {log_dir}\n")
            raise
        finally:
            cluster.stop()
            await redis.flushdb()
            await redis.aclose()


def bench_env(
    database_url: str, llm_base_url: str, instance: str, **settings: str
) -> dict[str, str]:
    """The environment of a bench's service processes: this machine's, without any
    SANDHIVE_* of the caller's, on the bench's database, Redis and model, no auth, no rate
    limit; `settings` (SANDHIVE_X=...) on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHIVE_")}
    env.update(
        SANDHIVE_DATABASE_URL=database_url,
        SANDHIVE_REDIS_URL=REDIS_URL,
        SANDHIVE_LLM_BASE_URL=llm_base_url,
        SANDHIVE_LLM_MODEL="bench",
        SANDHIVE_SANDBOX_IMAGE=IMAGE,
        SANDHIVE_INSTANCE=instance,
        SANDHIVE_RATE_LIMIT_PER_S="0",
        SANDHIVE_AUTH="disabled",
        **settings,
    )
    return env


def on_scratch_database(
    prefix: str,
    run: Callable[[str, Path], Coroutine[Any, Any, T]],
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> T:
    """`run(database_url, log_dir)` on a scratch database, dropped afterwards; the logs are
    removed when it succeeds and named on stderr when it fails. `loop_factory`: the event
    loop `run` gets (None: the standard library's)."""
    name = f"sandhive_bench_{os.getpid()}"
    database_url = create_database(name)
    log_dir = Path(tempfile.mkdtemp(prefix=f"sandhive-bench-{prefix}-"))
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            result = runner.run(run(database_url, log_dir))
        shutil.rmtree(log_dir)
        return result
    except Exception:
        sys.stderr.write(f"logs in {log_dir}\n")
        raise
    finally:
        asyncio.run(drop_database(name))


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def table(figures: Figures) -> str:
    rows: list[tuple[str, str, str, str]] = []

    def add(name: str, values: Sequence[float]) -> None:
        med, p95 = statistics.median(values) * 1000, pct(values, 0.95) * 1000
        rows.append((name, f"{med:.1f}", f"{p95:.1f}", str(len(values))))

    for label, values in figures.starts.items():
        pool = "warm pool" if label == "warm" else "cold, no pool"
        add(f"submit -> first LLM request, {pool} (ms)", values)
    for label, values in figures.gaps.items():
        add(f"per-step overhead, {label} (ms)", values)
    add("step end -> WebSocket follower (ms)", figures.to_ws)
    for key, (count, total) in figures.sandbox_starts.items():
        if count:
            rows.append(
                (
                    f"worker's sandbox start, {key} phase/source, mean (ms)",
                    f"{total / count * 1000:.1f}",
                    "",
                    str(int(count)),
                )
            )
    idle, busy, n = figures.rss_idle_mb, figures.rss_busy_mb, figures.running
    rows.append(("worker RSS idle (MB)", f"{idle:.1f}", "", ""))
    rows.append((f"worker RSS with {n} tasks running (MB)", f"{busy:.1f}", "", ""))
    rows.append(("worker memory per running task (MB)", f"{(busy - idle) / max(n, 1):.2f}", "", ""))
    cold, warm = figures.starts.get("cold", []), figures.starts.get("warm", [])
    if cold and warm:
        ratio = statistics.median(cold) / statistics.median(warm)
        rows.append(("start ratio cold / warm (medians)", f"{ratio:.1f}x", "", ""))
    width = max(len(r[0]) for r in rows)
    lines = [f"{'measure':<{width}}  {'median':>8}  {'p95':>8}  {'n':>4}"]
    lines += [f"{a:<{width}}  {b:>8}  {c:>8}  {d:>4}" for a, b, c, d in rows]
    lines.append(f"task errors: {figures.errors}; sandbox starts from the worker's /metrics")
    lines.append("step -> WebSocket, 1 and 100 viewers, isolated: bench/stream_latency.py")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--tasks", type=int, default=10, help="sequential tasks, cold and warm")
    parser.add_argument("--steps", type=int, default=10, help="LLM turns per task")
    parser.add_argument("--latency", type=float, default=0.5, help="fixed model latency (s)")
    parser.add_argument("--latency-tasks", type=int, default=2, help="tasks with that latency")
    parser.add_argument("--running", type=int, default=8, help="tasks running for the RSS figure")
    args = parser.parse_args()
    name = f"sandhive_bench_{os.getpid()}"
    database_url = create_database(name)
    log_dir = Path(tempfile.mkdtemp(prefix="sandhive-bench-"))
    try:
        figures = asyncio.run(run(args, database_url, log_dir))
        shutil.rmtree(log_dir)  # kept when the run fails
    finally:
        asyncio.run(drop_database(name))
    sys.stdout.write(table(figures) + "\n")


if __name__ == "__main__":
    main()
