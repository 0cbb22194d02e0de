"""The control plane under load: real API and worker processes, Postgres and Redis, no Docker.

    .venv/bin/python bench/scale.py [--slots 8,64,256] [--processes 1,2,4]
                                    [--rate 10,30,60] [--steps 10] [--viewers 1]
                                    [--viewer ws|sse] [--experiments 0.2]
                                    [--experiment-rows 2] [--duration 10] [--drain 30]
                                    [--apis 1] [--polls 20] [--keep-logs]

Each level starts `--processes` real worker processes (bench/scale_worker.py: a real
`Worker` whose sandbox and model are bench/standin.py's, answering at once) with
`--slots` slots in total and offers tasks at `--rate` per second for `--duration`
seconds, each of `--steps` model turns (all `execute_bash true`, then `submit`). Of
those, the share `--experiments` (default 0.2; 0: none) comes as experiment items: an
experiment (`POST /v1/experiments`: `--experiment-rows` inline rows, two arms of the same
task options, two attempts, the `exact` scorer, half its items running at once) is
created whenever that share has made up its items, the first at the window's start;
its items run as tasks on the same workers, whose experiment chore starts the rest as
items end, scores each (the stand-in's answer.txt against the rows' ground truth) and
records the experiment's events. The other tasks are submitted (`POST /v1/tasks`),
each watched from the start by `--viewers` followers (WebSocket, or Server-Sent Events
with `--viewer sse`), and each experiment by as many followers of its event stream;
meanwhile `--polls` requests a second read the API (`GET /v1/tasks/{id}` of a random
submitted task of the level, every fourth the first page of `GET /v1/tasks`). So what
is loaded is what every task costs the shared services: the claim, the lease and its
renewals, one transaction per step, the live events and their fan-out, the artifacts,
the experiment bookkeeping (items started, ended and scored, experiment events and
their followers), the reads. Webhooks are not: no subscription is registered, so a
task's start and end only look for one and the workers' sender polls an empty outbox.
The levels' flags take one value per level (comma-separated) or one value for all; the
level ends when every task it submitted and every experiment it created finished (or
`--drain` seconds after its last submit).

Per level it prints: tasks/s finished during the submit window (and submitted), the
experiments' items created and scored per second over the window, claim latency (the
task's `created_at` -> `started_at`, p50/p95), step write (the worker's `save_step`: one
transaction and the publish, p50/p95), step end -> viewer (p50/p95), Redis commands/s,
memory and clients, Postgres commits/s and WAL bytes per step (both over the window),
Postgres connections of the bench's database (the most seen), API p95 for one task and
for the list, the CPU each process group used (% of one core: API, workers in sum and
the busiest one, Postgres with every backend, Redis, the bench itself; the machine in %
of all its cores) and which of them saturates first. Claim latency, step end -> viewer
and the API reads are of the submitted tasks; step writes, steps/s, the per-step costs
and the CPU cover the experiments' tasks and chores too. Checked at every level: every
task succeeded, every viewer saw every `seq` in order, every experiment finished with
every item scored 1, and every experiment follower saw every `seq` in order and every
item's `item.ended`.

Needs Postgres and Redis, not Docker: it creates (and drops) a scratch database through
SANDHIVE_BENCH_ADMIN_URL (default postgresql://postgres@127.0.0.1:5432/postgres) and
uses SANDHIVE_BENCH_REDIS_URL (default redis://127.0.0.1:6379/12), which it empties
before and after. Redis's and Postgres's WAL and CPU figures are the servers' own, so
other users of those servers show in them: point both at servers of their own for
clean figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import httpx
import websockets
from redis.asyncio import Redis
from service import REDIS_URL, bench_env
from standin import ANSWER
from stream_latency import create_database, drop_database, free_port, wait_ready

BENCH = Path(__file__).resolve().parent
TICK = os.sysconf("SC_CLK_TCK")
SATURATED = 0.85
"""A single event loop (API, worker, Redis) past this share of one core is saturated."""
OURS = ("api", "workers", "postgres", "redis", "bench")
ARMS = ("a", "b")
ATTEMPTS = 2
"""Each experiment runs every row in both arms (the same task options), twice."""
LOCK_WAITS = """
    SELECT query, count(*) AS n FROM pg_stat_activity
    WHERE datname = $1 AND state = 'active' AND wait_event_type = 'Lock' GROUP BY query
"""


@dataclass(frozen=True)
class Level:
    slots: int
    processes: int
    rate: float
    steps: int
    viewers: int
    experiments: float
    """The share of the offered tasks that come as experiment items (0: none)."""
    rows: int
    """Rows per experiment: each runs `len(ARMS) * ATTEMPTS` items."""

    @property
    def items(self) -> int:
        """Items per experiment."""
        return self.rows * len(ARMS) * ATTEMPTS

    def label(self) -> str:
        share = (
            f", {self.experiments:.0%} as items of {self.items}-item experiments"
            if self.experiments
            else ""
        )
        return (
            f"{self.slots} slots in {self.processes} workers, {self.rate:g} tasks/s{share},"
            f" {self.steps} steps, {self.viewers} viewers"
        )


@dataclass
class Observed:
    """What one level's bench side saw."""

    submitted: list[str] = field(default_factory=list)
    submit_errors: int = 0
    to_viewer: list[float] = field(default_factory=list)
    gaps: int = 0
    viewer_errors: int = 0
    api: dict[str, list[float]] = field(
        default_factory=lambda: {"get": [], "list": [], "submit": [], "experiment": []}
    )
    api_errors: dict[str, int] = field(default_factory=dict)
    """`get 503`, `list ReadTimeout`...: the reads that failed, by what they got."""
    unfinished: int = 0
    """Tasks still queued or running `--drain` seconds after the last submit (then cancelled)."""
    max_pg_conns: int = 0
    lock_waits: dict[str, int] = field(default_factory=dict)
    """Statement -> backends seen waiting on a lock with it, summed over the samples."""
    conn_samples: int = 0
    """Backends of the bench's database seen, summed over the samples (the waits' base)."""
    max_redis_clients: int = 0
    redis_memory_mb: float = 0.0
    experiments: list[str] = field(default_factory=list)
    experiment_errors: int = 0
    """`POST /v1/experiments` that failed."""
    experiment_gaps: int = 0
    """`seq` gaps its followers saw in experiments' streams."""
    experiment_viewer_errors: int = 0
    items_seen: list[int] = field(default_factory=list)
    """Per experiment follower that saw `experiment.finished`: the `item.ended` it saw."""
    unfinished_experiments: int = 0
    """Experiments still running `--drain` seconds after the last submit (then cancelled)."""


@dataclass
class Snapshot:
    """Cumulative counters at one instant."""

    at: float
    redis_commands: int
    redis_cpu_s: float
    pg_commits: int
    wal_lsn: int
    steps: int
    cpu_s: dict[str, float]
    worker_cpu_s: list[float]
    machine: tuple[float, float]
    """(busy, total) jiffies of every core, from /proc/stat."""


@dataclass
class Row:
    """One level's figures, as printed."""

    level: Level
    window_s: float
    finished_per_s: float
    submitted_per_s: float
    claim: list[float]
    step_write: list[float]
    observed: Observed
    redis_ops_per_s: float
    pg_commits_per_s: float
    wal_per_step: float
    steps: int
    cpu: dict[str, float]
    """Group -> share of one core over the window (`worker max`: the busiest worker)."""
    machine: float
    failed: int
    items: int
    """Items of the level's experiments."""
    items_per_s: float
    """Those items over the window (created with their experiments)."""
    scored_per_s: float
    """Items that ended scored during the window."""
    experiments_unfinished: int
    """Experiments whose status is not `finished` at the level's end."""
    items_not_scored: int
    """Items that did not end `scored` with the score the stand-in's answer deserves (1)."""
    verdict: str = ""


# --- processes --------------------------------------------------------------------------


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """utime + stime of a process (and of its waited-for children), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICK


def parent_of(pid: int) -> int:
    """The parent's pid; 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def children_of(parent: int) -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and parent_of(int(e)) == parent]


def said_ready(log: Path) -> bool:
    """Whether a worker's log has its `ready with N slots` line."""
    return "ready with" in log.read_text(errors="replace")


def tree_cpu_seconds(parent: int) -> float:
    """A process tree one level deep (Postgres: the postmaster and its backends)."""
    own = cpu_seconds(parent, children=True)
    return own + sum(cpu_seconds(pid) for pid in children_of(parent))


def machine_jiffies() -> tuple[float, float]:
    with open("/proc/stat") as stat:
        values = [float(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


@dataclass
class Services:
    """The API and worker processes, on the bench's database and Redis."""

    env: dict[str, str]
    log_dir: Path
    apis: list[tuple[subprocess.Popen[bytes], int]] = field(default_factory=list)
    workers: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)
    started: int = 0

    def _spawn(self, args: list[str], name: str, **settings: str) -> subprocess.Popen[bytes]:
        env = {**self.env, **{f"SANDHIVE_{k.upper()}": v for k, v in settings.items()}}
        with (self.log_dir / f"{name}.log").open("ab") as out:
            return subprocess.Popen(
                [sys.executable, *args], env=env, stdout=out, stderr=subprocess.STDOUT
            )

    async def start_apis(self, count: int) -> None:
        for number in range(count):
            port = free_port()
            api = self._spawn(["-m", "app", "serve", "--port", str(port)], f"api-{number}")
            self.apis.append((api, port))
            await wait_ready(f"http://127.0.0.1:{port}")

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for _, port in self.apis]

    async def start_workers(self, level: Level) -> None:
        """`level.processes` workers sharing `level.slots`; returns once each said ready."""
        shares = [level.slots // level.processes] * level.processes
        for extra in range(level.slots % level.processes):
            shares[extra] += 1
        for slots in shares:
            self.started += 1
            name = f"scale-{self.started}"
            samples = self.log_dir / f"{name}.json"
            worker = self._spawn(
                [str(BENCH / "scale_worker.py"), str(samples)],
                name,
                worker_name=name,
                worker_concurrency=str(slots),
            )
            self.workers.append((worker, samples))
        for _, samples in self.workers:
            await self._until_ready(samples.with_suffix(".log"))

    async def _until_ready(self, log: Path) -> None:
        for _ in range(600):
            if said_ready(log):
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"worker did not start: see {log}")

    def stop_workers(self) -> list[float]:
        """Stop every worker; their step-write durations."""
        for worker, _ in self.workers:
            worker.send_signal(signal.SIGTERM)
        durations: list[float] = []
        for worker, samples in self.workers:
            worker.wait(timeout=60)
            if samples.exists():
                durations += json.loads(samples.read_text())["step_write_s"]
        self.workers = []
        return durations

    def stop(self) -> None:
        self.stop_workers()
        for api, _ in self.apis:
            api.terminate()
            api.wait(timeout=30)


# --- one level --------------------------------------------------------------------------


@dataclass
class Probe:
    """The bench's view of the shared services' counters."""

    pg: asyncpg.Pool
    """Two connections: the sampler's reads run beside the rest."""
    redis: Redis
    services: Services
    database: str
    postmaster: int = 0

    async def start(self) -> None:
        self.postmaster = parent_of(await self.pg.fetchval("SELECT pg_backend_pid()"))

    async def snapshot(self) -> Snapshot:
        stats = await self.redis.info("stats")
        cpu = await self.redis.info("cpu")
        commits = await self.pg.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", self.database
        )
        lsn = await self.pg.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        steps = await self.pg.fetchval("SELECT count(*) FROM steps")
        return Snapshot(
            at=time.monotonic(),
            redis_commands=int(stats["total_commands_processed"]),
            redis_cpu_s=float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
            pg_commits=int(commits),
            wal_lsn=int(lsn),
            steps=int(steps),
            cpu_s={
                "api": sum(cpu_seconds(api.pid) for api, _ in self.services.apis),
                "postgres": tree_cpu_seconds(self.postmaster),
                "bench": cpu_seconds(os.getpid()),
            },
            worker_cpu_s=[cpu_seconds(worker.pid) for worker, _ in self.services.workers],
            machine=machine_jiffies(),
        )

    async def sample(self, observed: Observed) -> None:
        """Connections and memory, the most seen, once a second until cancelled."""
        while True:
            conns = await self.pg.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", self.database
            )
            clients = await self.redis.info("clients")
            memory = await self.redis.info("memory")
            observed.max_pg_conns = max(observed.max_pg_conns, int(conns))
            observed.conn_samples += int(conns)
            for waiting in await self.pg.fetch(LOCK_WAITS, self.database):
                key = " ".join(str(waiting["query"]).split())[:70]
                observed.lock_waits[key] = observed.lock_waits.get(key, 0) + int(waiting["n"])
            observed.max_redis_clients = max(
                observed.max_redis_clients, int(clients["connected_clients"])
            )
            observed.redis_memory_mb = max(
                observed.redis_memory_mb, int(memory["used_memory"]) / 2**20
            )
            await asyncio.sleep(1.0)


@dataclass
class Load:
    """The bench's clients for one level: submitter, viewers, readers."""

    level: Level
    args: argparse.Namespace
    urls: list[str]
    client: httpx.AsyncClient
    observed: Observed = field(default_factory=Observed)
    viewing: set[asyncio.Task[None]] = field(default_factory=set)

    def url(self) -> str:
        return random.choice(self.urls)

    async def submit_all(self) -> list[asyncio.Task[None]]:
        """Submit at the level's rate for the window (open loop: a slow answer delays none);
        the submissions, some perhaps still waiting for their answer.

        Of every task the rate offers, the share `level.experiments` comes as an item of
        an experiment: an experiment is created whenever that share has accumulated its
        `level.items` items, the first at the window's first tick (so a level with a
        share creates at least one), the other ticks' tasks come as `POST /v1/tasks`."""
        level = self.level
        began, count = time.monotonic(), int(level.rate * self.args.duration)
        sending = []
        tasks_owed, items_owed = 0.0, float(level.items) if level.experiments else 0.0
        for number in range(count):
            await asyncio.sleep(max(0.0, began + number / level.rate - time.monotonic()))
            tasks_owed += 1 - level.experiments
            items_owed += level.experiments
            if tasks_owed >= 1 - 1e-9:
                tasks_owed -= 1
                sending.append(asyncio.create_task(self.submit_one()))
            if level.experiments and items_owed >= level.items - 1e-9:
                items_owed -= level.items
                sending.append(asyncio.create_task(self.submit_experiment()))
        await asyncio.sleep(max(0.0, began + count / level.rate - time.monotonic()))
        return sending

    async def submit_one(self) -> None:
        steps = self.level.steps
        body = {
            "prompt": "scale",
            "llm": {"model": f"scale-{steps}"},
            "limits": {"max_steps": steps + 2},
            "metadata": {"bench": "scale"},
        }
        began = time.monotonic()
        try:
            response = await self.client.post(f"{self.url()}/v1/tasks", json=body)
            response.raise_for_status()
        except httpx.HTTPError:
            self.observed.submit_errors += 1
            return
        self.observed.api["submit"].append(time.monotonic() - began)
        task_id = str(response.json()["id"])
        self.observed.submitted.append(task_id)
        for _ in range(self.level.viewers):
            view = self.view_sse if self.args.viewer == "sse" else self.view_ws
            viewing = asyncio.create_task(self.watch(view, task_id))
            self.viewing.add(viewing)
            viewing.add_done_callback(self.viewing.discard)

    async def submit_experiment(self) -> None:
        """One experiment (`POST /v1/experiments`): `level.rows` rows, each run in both arms
        `ATTEMPTS` times as a task like the submitted ones, scored `exact` against the
        stand-in's answer; half its items at once, so the workers' experiment chore starts
        the rest as items end. Followed by `level.viewers` followers of its event stream."""
        level = self.level
        task = {
            "llm": {"model": f"scale-{level.steps}"},
            "limits": {"max_steps": level.steps + 2},
            "metadata": {"bench": "scale"},
        }
        rows = [
            {"id": f"r{n}", "problem_statement": "scale", "ground_truth": ANSWER.decode()}
            for n in range(level.rows)
        ]
        body = {
            "name": "scale",
            "dataset": {"rows": rows},
            "arms": [{"name": name, "task": task} for name in ARMS],
            "scorer": {"kind": "exact"},
            "attempts": ATTEMPTS,
            "concurrency": max(1, level.items // 2),
            "metadata": {"bench": "scale"},
        }
        began = time.monotonic()
        try:
            response = await self.client.post(f"{self.url()}/v1/experiments", json=body)
            response.raise_for_status()
        except httpx.HTTPError:
            self.observed.experiment_errors += 1
            return
        self.observed.api["experiment"].append(time.monotonic() - began)
        experiment_id = str(response.json()["id"])
        self.observed.experiments.append(experiment_id)
        for _ in range(level.viewers):
            viewing = asyncio.create_task(self.watch_experiment(experiment_id))
            self.viewing.add(viewing)
            viewing.add_done_callback(self.viewing.discard)

    async def watch_experiment(self, experiment_id: str) -> None:
        """Follow an experiment's events (WebSocket, or SSE with `--viewer sse`) from its
        first to `experiment.finished`: every `seq` in order, the `item.ended` counted."""
        path = f"/v1/experiments/{experiment_id}"
        last, ended = 0, 0

        def seen(event: dict[str, Any]) -> bool:
            nonlocal last, ended
            seq = event.get("seq")
            if seq is not None:
                self.observed.experiment_gaps += seq != last + 1
                last = seq
            ended += event["type"] == "item.ended"
            return bool(event["type"] == "experiment.finished")

        try:
            if self.args.viewer == "sse":
                url = f"{self.url()}{path}/events?after=0"
                async with self.client.stream("GET", url, timeout=None) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: ") and seen(json.loads(line[6:])):
                            self.observed.items_seen.append(ended)
                            return
            else:
                url = self.url().replace("http://", "ws://")
                async with websockets.connect(f"{url}{path}/stream?after=0") as ws:
                    async for message in ws:
                        if seen(json.loads(message)):
                            self.observed.items_seen.append(ended)
                            return
        except (OSError, httpx.HTTPError, websockets.WebSocketException):
            pass
        self.observed.experiment_viewer_errors += 1  # failed, or ended before the finish

    async def watch(self, view: Callable[[str], Awaitable[int | None]], task_id: str) -> None:
        try:
            last = await view(task_id)
        except (OSError, httpx.HTTPError, websockets.WebSocketException):
            self.observed.viewer_errors += 1
            return
        if last is None:
            self.observed.viewer_errors += 1  # ended before task.finished

    def seen(self, event: dict[str, Any], last: int) -> tuple[int, bool]:
        """Note one event; (the last seq, whether it was task.finished)."""
        arrived = time.time()
        seq = event.get("seq")
        if seq is not None:
            self.observed.gaps += seq != last + 1
            last = seq
        if event["type"] == "step.completed":
            data = event["data"]
            started = datetime.fromisoformat(data["started_at"]).timestamp()
            ended = started + (data["llm_ms"] + data["tool_ms"]) / 1000
            self.observed.to_viewer.append(arrived - ended)
        return last, event["type"] == "task.finished"

    async def view_ws(self, task_id: str) -> int | None:
        url = self.url().replace("http://", "ws://")
        last = 0
        async with websockets.connect(f"{url}/v1/tasks/{task_id}/stream?after=0") as ws:
            async for message in ws:
                last, finished = self.seen(json.loads(message), last)
                if finished:
                    return last
        return None

    async def view_sse(self, task_id: str) -> int | None:
        last = 0
        url = f"{self.url()}/v1/tasks/{task_id}/events?after=0"
        async with self.client.stream("GET", url, timeout=None) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    last, finished = self.seen(json.loads(line[6:]), last)
                    if finished:
                        return last
        return None

    async def read_api(self) -> None:
        """`--polls` reads a second until cancelled: one task, every fourth the list."""
        reads: set[asyncio.Task[None]] = set()
        for number in itertools.count():
            await asyncio.sleep(1 / self.args.polls)
            ids = self.observed.submitted
            kind = "list" if number % 4 == 3 or not ids else "get"
            path = "/v1/tasks?limit=20" if kind == "list" else f"/v1/tasks/{random.choice(ids)}"
            read = asyncio.create_task(self.read_one(kind, path))
            reads.add(read)
            read.add_done_callback(reads.discard)

    async def read_one(self, kind: str, path: str) -> None:
        began = time.monotonic()
        try:
            response = await self.client.get(f"{self.url()}{path}")
            response.raise_for_status()
        except httpx.HTTPError as exc:
            got = exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else exc
            what = f"{kind} {got if isinstance(got, int) else type(got).__name__}"
            self.observed.api_errors[what] = self.observed.api_errors.get(what, 0) + 1
            return
        self.observed.api[kind].append(time.monotonic() - began)


async def run_level(
    level: Level, args: argparse.Namespace, services: Services, probe: Probe
) -> Row:
    await services.start_workers(level)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        load = Load(level, args, services.urls, client)
        sampling = asyncio.create_task(probe.sample(load.observed))
        reading = asyncio.create_task(load.read_api())
        since = await probe.pg.fetchval("SELECT now()")
        before = await probe.snapshot()
        sending = await load.submit_all()
        after = await probe.snapshot()
        await asyncio.gather(*sending)
        observed = load.observed
        left, running = await until_finished(
            probe.pg, observed.submitted, observed.experiments, args.drain
        )
        observed.unfinished, observed.unfinished_experiments = len(left), len(running)
        # None may run into the next level: the experiments first (their items' tasks too).
        await cancel_all(client, services.urls[0], "experiments", running)
        await cancel_all(client, services.urls[0], "tasks", left)
        reading.cancel()
        with_timeout = asyncio.wait_for(asyncio.gather(*load.viewing), timeout=30)
        await asyncio.gather(with_timeout, return_exceptions=True)
        sampling.cancel()
    step_write = services.stop_workers()
    return await figures(level, probe, load.observed, (before, after), since, step_write)


async def until_finished(
    pg: asyncpg.Pool, ids: list[str], experiments: list[str], drain_s: float
) -> tuple[list[str], list[str]]:
    """Wait for the tasks and the experiments to finish, at most `drain_s`; the tasks and
    the experiments still unfinished."""
    deadline = time.monotonic() + drain_s
    while True:
        left = await pg.fetch(
            "SELECT id FROM tasks WHERE id = ANY($1) AND finished_at IS NULL", ids
        )
        running = await pg.fetch(
            "SELECT id FROM experiments WHERE id = ANY($1) AND status = 'running'", experiments
        )
        if not (left or running) or time.monotonic() > deadline:
            return [str(row["id"]) for row in left], [str(row["id"]) for row in running]
        await asyncio.sleep(0.5)


async def cancel_all(client: httpx.AsyncClient, url: str, kind: str, ids: list[str]) -> None:
    """Cancel these tasks or experiments (`kind`: the path's collection)."""
    for some_id in ids:
        with contextlib.suppress(httpx.HTTPError):  # 409: it finished meanwhile
            await client.post(f"{url}/v1/{kind}/{some_id}/cancel")


async def figures(
    level: Level,
    probe: Probe,
    observed: Observed,
    window: tuple[Snapshot, Snapshot],
    since: datetime,
    step_write: list[float],
) -> Row:
    before, after = window
    span = after.at - before.at
    rows = await probe.pg.fetch(
        "SELECT status, EXTRACT(EPOCH FROM started_at - created_at) AS claim,"
        " finished_at <= $2 AS in_window FROM tasks WHERE id = ANY($1)",
        observed.submitted,
        since + timedelta(seconds=span),
    )
    items = await probe.pg.fetch(
        "SELECT status, score, updated_at <= $2 AS in_window FROM experiment_items"
        " WHERE experiment_id = ANY($1)",
        observed.experiments,
        since + timedelta(seconds=span),
    )
    unfinished = await probe.pg.fetchval(
        "SELECT count(*) FROM experiments WHERE id = ANY($1) AND status <> 'finished'",
        observed.experiments,
    )
    steps = after.steps - before.steps
    cpu = {k: (after.cpu_s[k] - before.cpu_s[k]) / span for k in after.cpu_s}
    cpu["redis"] = (after.redis_cpu_s - before.redis_cpu_s) / span
    workers = [b - a for a, b in zip(before.worker_cpu_s, after.worker_cpu_s, strict=True)]
    cpu["workers"] = sum(workers) / span
    cpu["worker max"] = max(workers, default=0.0) / span
    busy = after.machine[0] - before.machine[0]
    total = after.machine[1] - before.machine[1]
    cores = os.cpu_count() or 1
    cpu["others"] = max(0.0, busy / max(total, 1) * cores - sum(cpu[name] for name in OURS))
    row = Row(
        level=level,
        window_s=span,
        finished_per_s=sum(1 for r in rows if r["in_window"]) / span,
        submitted_per_s=len(observed.submitted) / span,
        claim=[float(r["claim"]) for r in rows if r["claim"] is not None],
        step_write=step_write,
        observed=observed,
        redis_ops_per_s=(after.redis_commands - before.redis_commands) / span,
        pg_commits_per_s=(after.pg_commits - before.pg_commits) / span,
        wal_per_step=(after.wal_lsn - before.wal_lsn) / max(steps, 1),
        steps=steps,
        cpu=cpu,
        machine=busy / total if total else 0.0,
        failed=sum(1 for r in rows if r["status"] == "failed"),
        items=len(items),
        items_per_s=len(items) / span,
        scored_per_s=sum(1 for i in items if i["status"] == "scored" and i["in_window"]) / span,
        experiments_unfinished=int(unfinished),
        items_not_scored=sum(1 for i in items if i["status"] != "scored" or i["score"] != 1),
    )
    row.verdict = verdict(row)
    return row


def verdict(row: Row) -> str:
    """Which resource gives out first, and the figures that say so."""
    cpu, cores = row.cpu, os.cpu_count() or 1
    single = {"the API process": cpu["api"], "Redis": cpu["redis"], "a worker": cpu["worker max"]}
    parts = [
        f"{name} ({share:.0%} of a core)" for name, share in single.items() if share > SATURATED
    ]
    if row.machine > 0.9:
        ours = {name: cpu[name] for name in OURS}
        biggest = max(ours, key=lambda name: ours[name])
        parts.append(
            f"the machine's {cores} cores ({row.machine:.0%} busy; most: {biggest} at"
            f" {ours[biggest]:.0%} of a core; others' processes {cpu['others']:.0%})"
        )
    if row.finished_per_s + row.scored_per_s < 0.9 * (row.submitted_per_s + row.items_per_s):
        items = (
            f" and {row.scored_per_s:.1f} experiment items/s scored of {row.items_per_s:.1f}"
            if row.items
            else ""
        )
        parts.append(
            f"a backlog ({row.finished_per_s:.1f} tasks/s finished of"
            f" {row.submitted_per_s:.1f} submitted{items}, claim p95 {ms(row.claim, 0.95)} ms)"
        )
    return "; ".join(parts) or "nothing"


# --- the table ----------------------------------------------------------------------------


def ms(values: Sequence[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000:.0f}"


def table(rows: Sequence[Row]) -> str:
    lines = []
    header: list[tuple[str, Callable[[Row], str]]] = [
        ("slots/procs", lambda r: f"{r.level.slots}/{r.level.processes}"),
        ("sub/s", lambda r: f"{r.submitted_per_s:.1f}"),
        ("done/s", lambda r: f"{r.finished_per_s:.1f}"),
        ("items/s", lambda r: f"{r.items_per_s:.1f}"),
        ("scored/s", lambda r: f"{r.scored_per_s:.1f}"),
        ("claim p50/95 ms", lambda r: f"{ms(r.claim, 0.5)}/{ms(r.claim, 0.95)}"),
        ("write p50/95", lambda r: f"{ms(r.step_write, 0.5)}/{ms(r.step_write, 0.95)}"),
        (
            "view p50/95",
            lambda r: f"{ms(r.observed.to_viewer, 0.5)}/{ms(r.observed.to_viewer, 0.95)}",
        ),
        ("steps/s", lambda r: f"{r.steps / r.window_s:.0f}"),
        ("redis ops/s", lambda r: f"{r.redis_ops_per_s:.0f}"),
        ("redis MB", lambda r: f"{r.observed.redis_memory_mb:.1f}"),
        ("pg tx/s", lambda r: f"{r.pg_commits_per_s:.0f}"),
        ("WAL B/step", lambda r: f"{r.wal_per_step:.0f}"),
        ("pg conns", lambda r: str(r.observed.max_pg_conns)),
        ("redis clients", lambda r: str(r.observed.max_redis_clients)),
        ("POST p95", lambda r: ms(r.observed.api["submit"], 0.95)),
        ("GET p95", lambda r: ms(r.observed.api["get"], 0.95)),
        ("list p95", lambda r: ms(r.observed.api["list"], 0.95)),
    ]
    cells = [[name for name, _ in header]] + [[cell(r) for _, cell in header] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines += ["", "CPU, % of one core (workers: sum / busiest; Postgres: every backend)"]
    lines += [f"  {r.level.slots}/{r.level.processes}: {cpu_line(r)}" for r in rows]
    lines += ["", "Per step (over the window): CPU ms, Postgres commits, Redis commands"]
    lines += [f"  {r.level.slots}/{r.level.processes}: {per_step(r)}" for r in rows]
    lines += ["", "Postgres backends waiting on a lock (% of the backends sampled), the top 2"]
    lines += [f"  {r.level.slots}/{r.level.processes}: {lock_line(r)}" for r in rows]
    lines += ["", "Experiments (POST /v1/experiments; their items run as tasks)"]
    lines += [f"  {r.level.slots}/{r.level.processes}: {experiment_line(r)}" for r in rows]
    lines.append("")
    lines += [f"  {r.level.label()}: {outcome_line(r)}" for r in rows]
    return "\n".join(lines)


def outcome_line(r: Row) -> str:
    o = r.observed
    reads = ", ".join(f"{what}: {n}" for what, n in sorted(o.api_errors.items()))
    return (
        f"first to give: {r.verdict}; failed tasks {r.failed}, unfinished after the drain"
        f" {o.unfinished}, seq gaps {o.gaps}, viewer errors {o.viewer_errors}, submit errors"
        f" {o.submit_errors}, API read errors {sum(o.api_errors.values())}"
        + (f" ({reads})" if reads else "")
    )


def experiment_line(r: Row) -> str:
    o, level = r.observed, r.level
    if not level.experiments:
        return "none (--experiments 0)"
    short = sum(1 for seen in o.items_seen if seen != level.items)
    return (
        f"{len(o.experiments)} experiments of {level.rows} rows x {len(ARMS)} arms x"
        f" {ATTEMPTS} attempts ({r.items} items, concurrency {max(1, level.items // 2)} each),"
        f" POST p95 {ms(o.api['experiment'], 0.95)} ms; not finished: {r.experiments_unfinished}"
        f" (running after the drain: {o.unfinished_experiments}), items not scored 1:"
        f" {r.items_not_scored}; followers that saw the finish: {len(o.items_seen)}, missed an"
        f" item.ended: {short}, seq gaps: {o.experiment_gaps}, errors:"
        f" {o.experiment_viewer_errors}; submit errors: {o.experiment_errors}"
    )


def cpu_line(r: Row) -> str:
    c = r.cpu
    return (
        f"API {c['api']:.0%}, workers {c['workers']:.0%} / {c['worker max']:.0%},"
        f" Postgres {c['postgres']:.0%}, Redis {c['redis']:.0%}, bench {c['bench']:.0%},"
        f" other processes {c['others']:.0%}; machine {r.machine:.0%} busy"
    )


def per_step(r: Row) -> str:
    steps = max(r.steps, 1)
    cost = {name: r.cpu[name] * r.window_s * 1000 / steps for name in OURS if name != "bench"}
    spent = ", ".join(f"{name} {value:.1f}" for name, value in cost.items())
    commits = r.pg_commits_per_s * r.window_s / steps
    commands = r.redis_ops_per_s * r.window_s / steps
    return f"CPU ms: {spent}; {commits:.1f} commits, {commands:.0f} Redis commands"


def lock_line(r: Row) -> str:
    waits = sorted(r.observed.lock_waits.items(), key=lambda item: -item[1])[:2]
    base = max(r.observed.conn_samples, 1)
    return "; ".join(f"{n / base:.0%} {query}" for query, n in waits) or "none seen"


# --- main ---------------------------------------------------------------------------------


def levels(args: argparse.Namespace) -> list[Level]:
    """One level per value of --slots; the other flags give one value per level or one for all."""
    slots = values(args.slots, int, 0)
    count = len(slots)
    processes = values(args.processes, int, count)
    rate = values(args.rate, float, count)
    steps = values(args.steps, int, count)
    viewers = values(args.viewers, int, count)
    share = values(args.experiments, float, count)
    rows = values(args.experiment_rows, int, count)
    if any(not 0 <= s <= 1 for s in share) or any(r < 1 for r in rows):
        raise SystemExit("--experiments: a share from 0 to 1; --experiment-rows: at least 1")
    return [
        Level(
            slots[i], min(processes[i], slots[i]), rate[i], steps[i], viewers[i], share[i], rows[i]
        )
        for i in range(count)
    ]


def values(text: str, kind: type[Any], count: int) -> list[Any]:
    parsed = [kind(part) for part in text.split(",")]
    if count and len(parsed) == 1:
        return parsed * count
    if count and len(parsed) != count:
        raise SystemExit(f"{text!r}: one value, or one per level ({count})")
    return parsed


async def run(args: argparse.Namespace, name: str, database_url: str, log_dir: Path) -> list[Row]:
    redis = Redis.from_url(REDIS_URL)
    await redis.flushdb()
    env = bench_env(
        database_url,
        "http://127.0.0.1:9/v1",  # never called: the workers' model is in process
        f"scale-{os.getpid()}",
        SANDHIVE_WARM_POOL_SIZE="0",
        SANDHIVE_WORKER_SHUTDOWN_GRACE_S="5",
    )
    services = Services(env, log_dir)
    pg = await asyncpg.create_pool(database_url.replace("+asyncpg", ""), min_size=2, max_size=2)
    try:
        await services.start_apis(args.apis)
        probe = Probe(pg, redis, services, name)
        await probe.start()
        rows = []
        for level in levels(args):
            sys.stderr.write(f"level: {level.label()}\n")
            rows.append(await run_level(level, args, services, probe))
        return rows
    except Exception:
        sys.stderr.write(f"logs in {log_dir}\n")
        raise
    finally:
        services.stop()
        await pg.close()
        await redis.flushdb()
        await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--slots", default="8,64,256", help="worker slots in total, per level")
    parser.add_argument("--processes", default="1,2,4", help="worker processes")
    parser.add_argument("--rate", default="10,30,60", help="tasks submitted per second")
    parser.add_argument("--steps", default="10", help="model turns per task")
    parser.add_argument("--viewers", default="1", help="live followers per task")
    parser.add_argument("--viewer", choices=("ws", "sse"), default="ws", help="their protocol")
    parser.add_argument(
        "--experiments", default="0.2", help="share of the tasks run as experiment items"
    )
    parser.add_argument(
        "--experiment-rows",
        default="2",
        help=f"rows per experiment (x{len(ARMS) * ATTEMPTS} items)",
    )
    parser.add_argument("--duration", type=float, default=10, help="submit window (s)")
    parser.add_argument("--drain", type=float, default=30, help="wait for the rest (s)")
    parser.add_argument("--apis", type=int, default=1, help="API processes")
    parser.add_argument("--polls", type=float, default=20, help="API reads per second")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    args = parser.parse_args()
    name = f"sandhive_scale_{os.getpid()}"
    database_url = create_database(name)
    log_dir = Path(tempfile.mkdtemp(prefix="sandhive-scale-"))
    try:
        rows = asyncio.run(run(args, name, database_url, log_dir))
        if args.keep_logs:
            sys.stderr.write(f"logs in {log_dir}\n")
        else:
            shutil.rmtree(log_dir)  # kept when the run fails
    finally:
        asyncio.run(drop_database(name))
    sys.stdout.write(table(rows) + "\n")


if __name__ == "__main__":
    main()
