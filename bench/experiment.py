"""Experiment throughput: Sandhive's service against the package's own benchmark runner.

    .venv/bin/python bench/experiment.py [--rows 300] [--concurrency 8] [--single 5]
                                         [--config POOL:TICK ...] [--package-venv .bench-venv]
                                         [--env SANDHIVE_X=VALUE ...] [--no-package]

The same rows (bench/package_task/data.json, ground truth "42") go through both, with the
same instant scripted model (app.scripted, in a process of its own; its sockets set
TCP_NODELAY) and the same concurrency:

  * Sandhive: the whole service is started here (API, a worker with `concurrency` slots,
    on a scratch Postgres database and a Redis DB), and one experiment of two arms
    (`sandbox`: one execute_bash writing the answer, then submit; `vanilla`: one reply) is
    submitted with `POST /v1/experiments` and timed from the submit to `finished`, once per
    `--config` (the worker's warm pool size : SANDHIVE_EXPERIMENT_TICK_S; by default the
    shipped defaults 0:1, a warm pool 8:1, and 8:0.1, a tick short enough to stand for
    advancing an experiment as soon as one of its tasks ends), each on a fresh service. Before
    it, single tasks of each arm are timed (submit -> `task.finished` on the WebSocket),
    for the per-item overhead: experiment wall x concurrency / items, against a single
    task's wall.
  * The package: `llm-in-sandbox benchmark --task sandhive_bench --num_workers N`, once per
    mode (`llm-in-sandbox`, then `llm`), from the virtualenv bench/package_setup.sh makes,
    with its image built on the local Debian base. Its figure is the runner's own
    `elapsed_time_seconds` (from its first problem to its last; its interpreter start and
    dataset load are left out, as Sandhive's service start is); the process wall is shown
    too.

rows/min counts a row once both arms have run it. CPU is the whole machine's, from
/proc/stat, over each timed phase (it includes Postgres, Redis, dockerd, and anything else
running: the load average is printed with it), then split by process from /proc/PID/stat
(what exited during the phase — runc calls, containers' processes — stays unattributed).
Sandhive's items are also split into where their time went (task rows in Postgres): queued,
running, and waiting after the task ended until the next experiment tick scored the item
(the item holds its concurrency slot until then).

Needs Postgres, Redis, Docker and the sandbox image (as bench/service.py), and for the
package's side bench/package_setup.sh once; without it Sandhive's figures still print.
SANDHIVE_BENCH_REDIS_URL (default redis://127.0.0.1:6379/12) is emptied before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from redis.asyncio import Redis

from app.scripted import Script, Turn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import Bench, Cluster, ScriptedLLMProcess
from stream_latency import create_database, drop_database

HERE = Path(__file__).resolve().parent

REDIS_URL = os.environ.get("SANDHIVE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
IMAGE = os.environ.get("SANDHIVE_BENCH_IMAGE", "sandhive-sandbox:latest")
PACKAGE_IMAGE = os.environ.get("SANDHIVE_BENCH_PACKAGE_IMAGE", "llm-in-sandbox-local:v0.1")
DATA = HERE / "package_task" / "data.json"
PACKAGE_TASK = "sandhive_bench"
SANDBOX_MODEL, VANILLA_MODEL = "bench-sandbox", "bench-vanilla"
ANSWER = "42"
COMMAND = (
    f"printf {ANSWER} > /testbed/answer.txt"
    " && mkdir -p /testbed/output && cp /testbed/answer.txt /testbed/output/answer.txt"
)
"""The package reads /testbed/answer.txt (its runner's output dir), Sandhive output/answer.txt."""
MAX_STEPS = 5
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Cpu:
    """Busy CPU-seconds of the whole machine between two /proc/stat readings, and the
    1-minute load average at the end (well above the CPU count: something else ran too)."""

    busy_s: float = 0.0
    wall_s: float = 0.0
    load: float = 0.0
    by_group: dict[str, float] = field(default_factory=dict)
    """CPU-s of the processes alive at the end, by group; what exited is in `unattributed`."""

    def groups_line(self, top: int = 7) -> str:
        ranked = sorted(self.by_group.items(), key=lambda kv: -kv[1])[:top]
        rest = self.busy_s - sum(self.by_group.values())
        parts = [f"{name} {sec:.1f}" for name, sec in ranked if sec >= 0.05]
        return ", ".join([*parts, f"unattributed (exited processes, kernel) {max(rest, 0):.1f}"])

    @property
    def cores(self) -> float:
        return self.busy_s / self.wall_s if self.wall_s else 0.0


class CpuMeter:
    def __init__(self) -> None:
        self._start = _busy_jiffies()
        self._procs = _process_times()
        self._children = _reaped_children_s()
        self._t0 = time.monotonic()

    def stop(self) -> Cpu:
        busy = (_busy_jiffies() - self._start) / CLK_TCK
        groups: dict[str, float] = {}
        for pid, (group, seconds) in _process_times().items():
            before = self._procs.get(pid)
            spent = seconds - before[1] if before and before[0] == group else seconds
            groups[group] = groups.get(group, 0.0) + spent
        reaped = _reaped_children_s() - self._children
        if reaped > 0:
            groups["the bench's exited children (the package's runner)"] = reaped
        return Cpu(busy, time.monotonic() - self._t0, os.getloadavg()[0], groups)


def _process_times() -> dict[int, tuple[str, float]]:
    """pid -> (group, utime + stime + reaped children's, in s) of every process but PID 1."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or entry.name == "1":
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                text = stat.read()
            with open(f"/proc/{entry.name}/cmdline", "rb") as cmd:
                cmdline = cmd.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        own = int(entry.name) == os.getpid()  # its reaped children: _reaped_children_s
        ticks = sum(int(v) for v in text.rsplit(")", 1)[1].split()[11 : 13 if own else 15])
        found[int(entry.name)] = (_group(comm, cmdline), ticks / CLK_TCK)
    return found


def _reaped_children_s() -> float:
    times = os.times()
    return times.children_user + times.children_system


def _group(comm: str, cmdline: str) -> str:
    """A readable owner for a process: Sandhive's, the package's, Docker's, or other."""
    marks = (
        ("-m app serve", "Sandhive API"),
        ("-m app worker", "Sandhive worker"),
        ("llm-in-sandbox benchmark", "package runner"),
        ("bench/experiment.py", "bench + scripted model"),
        ("multiprocessing", "bench + scripted model"),
        ("pytest", "other test runs"),
    )
    for mark, group in marks:
        if mark in cmdline:
            return group
    if comm.startswith("postgres"):
        return "postgres"
    if comm.startswith("containerd-shim"):
        return "containerd-shim"
    if comm in {"dockerd", "containerd", "redis-server", "runc"}:
        return comm
    return "other (containers' processes, ...)"


def _busy_jiffies() -> int:
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields[:8]) - idle


def settle(max_s: float = 90.0, busy_below: float = 0.15, for_s: float = 3.0) -> float:
    """Wait until the machine has been nearly idle for `for_s` seconds (at most `max_s`);
    the seconds waited.

    What one side leaves behind runs on after it returns: the kernel tears a bridge
    network namespace down on its own time once its container is gone (the package's
    containers use the default bridge), dockerd and containerd collect. Measured next
    without a pause, the other side would pay for it.
    """
    started = time.monotonic()
    cores = os.cpu_count() or 1
    quiet_since = None
    while time.monotonic() - started < max_s:
        before = _busy_jiffies()
        time.sleep(0.5)
        busy = (_busy_jiffies() - before) / CLK_TCK / (0.5 * cores)
        now = time.monotonic()
        if busy >= busy_below:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now - 0.5
        elif now - quiet_since >= for_s:
            return now - started
    sys.stderr.write(f"the machine did not settle within {max_s:.0f} s: measuring anyway\n")
    return time.monotonic() - started


def process_cpu_s(pid: int) -> float:
    """utime + stime (and reaped children's) of one process, in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        after_name = stat.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in after_name[11:15]) / CLK_TCK


@dataclass
class SandhiveFigures:
    pool: int = 0
    tick: float = 1.0
    wall_s: float = 0.0
    items: int = 0
    concurrency: int = 0
    cpu: Cpu = field(default_factory=Cpu)
    api_cpu_s: float = 0.0
    worker_cpu_s: float = 0.0
    single: dict[str, list[float]] = field(default_factory=dict)
    arms: list[dict[str, Any]] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    profile: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class PackageRun:
    mode: str
    elapsed_s: float
    process_s: float
    total: int
    mean_score: float
    errors: int
    cpu: Cpu


def load_rows(n: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(DATA.read_text())
    if n > len(rows):
        raise SystemExit(f"--rows {n}: {DATA} has {len(rows)} rows")
    return rows[:n]


def scripts() -> dict[str, Script]:
    sandbox = Script(
        turns=[Turn(tool="execute_bash", arguments={"command": COMMAND}), Turn(tool="submit")]
    )
    vanilla = Script(turns=[Turn(content=ANSWER)], tools="none")
    return {SANDBOX_MODEL: sandbox, VANILLA_MODEL: vanilla}


def arm_task(mode: str) -> dict[str, Any]:
    if mode == "sandbox":
        return {"llm": {"model": SANDBOX_MODEL}, "limits": {"max_steps": MAX_STEPS}}
    return {"llm": {"model": VANILLA_MODEL}}


# Sandhive


async def run_sandhive(
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    llm: ScriptedLLMProcess,
    pool: int,
    tick: float,
) -> SandhiveFigures:
    name = f"sandhive_bench_exp_{os.getpid()}"
    database_url = await asyncio.to_thread(create_database, name)
    log_dir = Path(tempfile.mkdtemp(prefix="sandhive-bench-exp-"))
    redis = Redis.from_url(REDIS_URL)
    await redis.flushdb()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHIVE_")}
    env.update(
        SANDHIVE_DATABASE_URL=database_url,
        SANDHIVE_REDIS_URL=REDIS_URL,
        SANDHIVE_LLM_BASE_URL=llm.base_url,
        SANDHIVE_LLM_MODEL=SANDBOX_MODEL,
        SANDHIVE_SANDBOX_IMAGE=IMAGE,
        SANDHIVE_INSTANCE=f"bench-exp-{os.getpid()}",
        SANDHIVE_RATE_LIMIT_PER_S="0",
        SANDHIVE_AUTH="disabled",
        SANDHIVE_EXPERIMENT_TICK_S=str(tick),
    )
    env.update(dict(setting.split("=", 1) for setting in args.env))
    cluster = Cluster(env, log_dir)
    failed = True
    try:
        await cluster.start_api()
        cluster.start_worker("bench-exp", concurrency=args.concurrency, pool=pool)
        async with httpx.AsyncClient(base_url=cluster.base_url, timeout=60) as client:
            bench = Bench(cluster, llm, client)
            figures = SandhiveFigures(pool, tick, concurrency=args.concurrency)
            for mode in ("sandbox", "vanilla"):  # warm-up: imports, image cache, connections
                await single_task(bench, mode)
            for _ in range(args.single):
                for mode in ("sandbox", "vanilla"):
                    figures.single.setdefault(mode, []).append(await single_task(bench, mode))
            await asyncio.sleep(1.0 + pool * 0.5)  # the warm pool refills after the singles
            await experiment(client, cluster, rows, args.concurrency, figures)
            figures.profile = await profile(database_url)
        failed = False
        return figures
    finally:
        cluster.stop()
        await redis.flushdb()
        await redis.aclose()
        await drop_database(name)
        if failed:
            sys.stderr.write(f"logs in {log_dir}\n")
        else:
            shutil.rmtree(log_dir)


async def single_task(bench: Bench, mode: str) -> float:
    """Seconds from just before `POST /v1/tasks` to the WebSocket's `task.finished`."""
    body = {"prompt": "Row 0: what is 6 * 7?", "mode": mode, **arm_task(mode)}
    sent = time.monotonic()
    response = await bench.client.post("/v1/tasks", json=body)
    response.raise_for_status()
    status = await bench.follow(str(response.json()["id"]), record=False)
    took = time.monotonic() - sent
    if status != "succeeded":
        raise RuntimeError(f"single {mode} task ended {status}")
    return took


async def experiment(
    client: httpx.AsyncClient,
    cluster: Cluster,
    rows: list[dict[str, Any]],
    concurrency: int,
    figures: SandhiveFigures,
) -> None:
    body = {
        "name": "bench: sandbox vs vanilla",
        "dataset": {"rows": rows},
        "arms": [
            {"name": mode, "mode": mode, "task": arm_task(mode)} for mode in ("sandbox", "vanilla")
        ],
        "scorer": {"kind": "exact"},
        "attempts": 1,
        "concurrency": concurrency,
    }
    assert cluster.api is not None
    assert cluster.worker is not None
    await asyncio.to_thread(settle)
    api_cpu, worker_cpu = process_cpu_s(cluster.api.pid), process_cpu_s(cluster.worker.pid)
    meter = CpuMeter()
    sent = time.monotonic()
    response = await client.post("/v1/experiments", json=body)
    response.raise_for_status()
    experiment_id = response.json()["id"]
    while True:
        state = (await client.get(f"/v1/experiments/{experiment_id}")).json()
        if state["status"] != "running":
            break
        await asyncio.sleep(0.1)
    figures.wall_s = time.monotonic() - sent
    figures.cpu = meter.stop()
    figures.api_cpu_s = process_cpu_s(cluster.api.pid) - api_cpu
    figures.worker_cpu_s = process_cpu_s(cluster.worker.pid) - worker_cpu
    figures.items = len(rows) * 2
    for arm, counts in state["progress"].items():
        for status, n in counts.items():
            if n:
                figures.statuses[f"{arm}/{status}"] = n
    results = (await client.get(f"/v1/experiments/{experiment_id}/results")).json()
    figures.arms = results["arms"]


async def profile(database_url: str) -> dict[str, dict[str, float]]:
    """Per arm, the medians of where an item's time went, from the rows Postgres kept.

    queue: task created -> started by a worker; run: started -> finished; record: finished
    -> the item scored. The item holds one of the experiment's `concurrency` slots for all
    three (the runner counts `running` items), so `record` — the wait for the next tick —
    is slot time in which nothing runs.
    """
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        records = await conn.fetch(
            """
            select i.arm, t.created_at, t.started_at, t.finished_at, i.updated_at
            from experiment_items i join tasks t on t.id = i.task_id
            where t.started_at is not null and t.finished_at is not null
            order by t.created_at
            """
        )
    finally:
        await conn.close()
    by_arm: dict[str, dict[str, list[float]]] = {}
    for r in records:
        parts = by_arm.setdefault(r["arm"], {"queue": [], "run": [], "record": []})
        parts["queue"].append((r["started_at"] - r["created_at"]).total_seconds())
        parts["run"].append((r["finished_at"] - r["started_at"]).total_seconds())
        parts["record"].append((r["updated_at"] - r["finished_at"]).total_seconds())
    return {
        arm: {k: statistics.median(v) for k, v in parts.items()} for arm, parts in by_arm.items()
    }


# The package


def package_cli(venv: Path) -> Path | None:
    cli = venv / "bin" / "llm-in-sandbox"
    if not cli.exists():
        return None
    task = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.util as u;"
            "print(u.find_spec('llm_in_sandbox').submodule_search_locations[0])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not (Path(task) / "benchmark" / PACKAGE_TASK / "config.yaml").exists():
        return None
    return cli


def run_package(
    cli: Path, llm_url: str, rows: int, concurrency: int, mode: str, out: Path
) -> PackageRun:
    model = SANDBOX_MODEL if mode == "llm-in-sandbox" else VANILLA_MODEL
    argv = [
        str(cli),
        "benchmark",
        f"--task={PACKAGE_TASK}",
        f"--llm_name={model}",
        f"--llm_base_url={llm_url}",
        f"--docker_image={PACKAGE_IMAGE}",
        f"--num_workers={concurrency}",
        f"--max_steps={MAX_STEPS}",
        "--start_id=0",
        f"--end_id={rows}",
        f"--mode={mode}",
        f"--output_dir={out}",
    ]
    # litellm fetches a price list from the internet at import unless told not to.
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    settle()
    meter = CpuMeter()
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    process_s = time.monotonic() - started
    cpu = meter.stop()
    results = sorted(out.glob(f"*_{mode_suffix(mode)}/results.json"))
    if done.returncode != 0 or not results:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise RuntimeError(f"the package's benchmark ({mode}) failed: exit {done.returncode}")
    data = json.loads(results[-1].read_text())
    return PackageRun(
        mode,
        float(data["elapsed_time_seconds"]),
        process_s,
        int(data["total"]),
        float(data["mean_score"]),
        int(data["num_errors"]),
        cpu,
    )


def mode_suffix(mode: str) -> str:
    return "LLMinSandbox" if mode == "llm-in-sandbox" else "vanillaLLM"


# The report


def report(
    args: argparse.Namespace,
    runs: list[SandhiveFigures],
    package: list[PackageRun] | None,
    note: str,
) -> str:
    lines = [
        f"{args.rows} rows x 2 arms (sandbox, vanilla), instant scripted model, concurrency "
        f"{args.concurrency}, {os.cpu_count()} CPUs"
        + (f"; Sandhive settings {' '.join(args.env)}" if args.env else ""),
        "",
    ]
    for s in runs:
        lines += sandhive_lines(args, s)
    if package is None:
        lines.append(note)
        return "\n".join(lines)
    lines += package_lines(args, package)
    package_rpm = args.rows / sum(run.elapsed_s for run in package) * 60
    lines.append("")
    for s in runs:
        rpm = args.rows / s.wall_s * 60
        lines.append(
            f"Sandhive (pool {s.pool}, tick {s.tick:g} s) / package: {rpm / package_rpm:.2f}x "
            f"rows/min ({rpm:.1f} vs {package_rpm:.1f}; target 5x)"
        )
    return "\n".join(lines)


def sandhive_lines(args: argparse.Namespace, s: SandhiveFigures) -> list[str]:
    rpm = args.rows / s.wall_s * 60
    lines = [
        f"Sandhive, warm pool {s.pool}, experiment tick {s.tick:g} s "
        "(POST /v1/experiments -> finished)",
        f"  wall {s.wall_s:.1f} s for {s.items} items: {rpm:.1f} rows/min "
        f"({s.items / s.wall_s * 60:.1f} items/min)",
        f"  items: {', '.join(f'{k} {v}' for k, v in sorted(s.statuses.items()))}",
    ]
    for arm in s.arms:
        sec = arm.get("seconds") or {}
        lines.append(
            f"  arm {arm['arm']}: n {arm['n']}, mean {arm['mean']}, task seconds median "
            f"{_num(sec.get('median'))}"
        )
    per_item = s.wall_s * s.concurrency / s.items
    single = {mode: statistics.median(v) for mode, v in s.single.items()}
    reference = statistics.mean(single.values())
    lines.append(
        f"  single task, submit -> finished (median of {args.single}): "
        + ", ".join(f"{mode} {v * 1000:.0f} ms" for mode, v in single.items())
    )
    lines.append(
        f"  per item: wall x concurrency / items = {per_item * 1000:.0f} ms, against "
        f"{reference * 1000:.0f} ms for a single task (mean of the two arms' medians): "
        f"overhead {(per_item - reference) * 1000:+.0f} ms per item"
    )
    lines.append(
        f"  CPU (whole machine): {s.cpu.busy_s:.1f} CPU-s over {s.cpu.wall_s:.1f} s "
        f"({s.cpu.cores:.2f} of {os.cpu_count()} cores busy, load {s.cpu.load:.1f}); "
        f"API {s.api_cpu_s:.1f} CPU-s, worker {s.worker_cpu_s:.1f} CPU-s; "
        f"{s.cpu.busy_s / s.items:.3f} CPU-s per item"
    )
    lines.append(f"    by process: {s.cpu.groups_line()}")
    if s.profile:
        lines.append("  where an item's time went (medians, s):")
        for name, parts in s.profile.items():
            lines.append("    " + name + ": " + ", ".join(f"{k} {v:.3f}" for k, v in parts.items()))
    lines.append("")
    return lines


def package_lines(args: argparse.Namespace, package: list[PackageRun]) -> list[str]:
    lines = [
        f"The package (llm-in-sandbox==0.2.0 benchmark, --num_workers {args.concurrency}, "
        "one run per mode)"
    ]
    for run in package:
        lines.append(
            f"  --mode {run.mode}: {run.total} rows in {run.elapsed_s:.1f} s (its elapsed_time; "
            f"process {run.process_s:.1f} s): {run.total / run.elapsed_s * 60:.1f} rows/min, "
            f"mean score {run.mean_score:.3f}, errors {run.errors}; CPU {run.cpu.busy_s:.1f} "
            f"CPU-s ({run.cpu.cores:.2f} cores busy, load {run.cpu.load:.1f})"
        )
        lines.append(f"    by process: {run.cpu.groups_line()}")
    rows = args.rows
    elapsed = sum(run.elapsed_s for run in package)
    process = sum(run.process_s for run in package)
    lines.append(
        f"  both arms: {elapsed:.1f} s: {rows / elapsed * 60:.1f} rows/min "
        f"(by process wall {process:.1f} s: {rows / process * 60:.1f} rows/min); "
        f"per item {elapsed * args.concurrency / (2 * rows) * 1000:.0f} ms"
    )
    busy = sum(run.cpu.busy_s for run in package)
    lines.append(f"  CPU (whole machine): {busy:.1f} CPU-s, {busy / (2 * rows):.3f} CPU-s per item")
    return lines


def _num(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--rows", type=int, default=300, help="rows of data.json to run")
    parser.add_argument("--concurrency", type=int, default=8, help="both sides' concurrency")
    parser.add_argument(
        "--config",
        action="append",
        type=pool_tick,
        help="Sandhive's WARM_POOL:TICK_S, repeatable (default: 0:1, 8:1 and 8:0.1)",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="SANDHIVE_X=VALUE",
        help="a setting for Sandhive's API and worker in every config, repeatable",
    )
    parser.add_argument("--single", type=int, default=5, help="single tasks timed per arm")
    parser.add_argument("--package-venv", type=Path, default=HERE.parent / ".bench-venv")
    parser.add_argument("--no-package", action="store_true", help="Sandhive's side only")
    args = parser.parse_args()
    configs = args.config or [(0, 1.0), (8, 1.0), (8, 0.1)]
    rows = load_rows(args.rows)
    cli = None if args.no_package else package_cli(args.package_venv)
    note = (
        "The package: skipped (--no-package)."
        if args.no_package
        else f"The package: not installed in {args.package_venv} (no llm-in-sandbox there, or "
        f"its benchmark folder lacks {PACKAGE_TASK}). Create it with:\n"
        f"  bash bench/package_setup.sh {args.package_venv}\n"
        "then run this again for the side-by-side figures."
    )
    with ScriptedLLMProcess() as llm:
        for model, script in scripts().items():
            llm.add_script(model, script)
        runs = [asyncio.run(run_sandhive(args, rows, llm, *config)) for config in configs]
        package = None
        if cli is not None:
            out = Path(tempfile.mkdtemp(prefix="sandhive-bench-package-"))
            try:
                package = [
                    run_package(cli, llm.base_url, args.rows, args.concurrency, mode, out)
                    for mode in ("llm-in-sandbox", "llm")
                ]
            finally:
                shutil.rmtree(out, ignore_errors=True)
    sys.stdout.write(report(args, runs, package, note) + "\n")


def pool_tick(text: str) -> tuple[int, float]:
    pool, _, tick = text.partition(":")
    return int(pool), float(tick or 1.0)


if __name__ == "__main__":
    main()
