"""The package against Sandhive's whole service, in one run, on the same instant fake model.

    SANDHIVE_BENCH_REDIS_URL=redis://127.0.0.1:6379/1 .venv/bin/python bench/compare.py [--quick]
        [--steps 10] [--package-venv .bench-venv] [--no-package] [--env SANDHIVE_X=VALUE ...]
        [--floor-cycles 16]

Both sides talk to one scripted OpenAI-compatible server (app.scripted, in a process of its
own, TCP_NODELAY on its sockets) that answers at once: K-1 `execute_bash` calls of `true`,
then `submit`. So what is measured is each system's own cost around the model.

  * The package: `llm-in-sandbox benchmark` (its process-pool runner, `--num_workers N`)
    from the virtualenv bench/package_setup.sh makes, its image built on the local Debian
    base (as bench/experiment.py runs it). Its figures are its runner's own
    `elapsed_time_seconds` (interpreter start and dataset load left out).
  * Sandhive: API, Postgres (a scratch database), Redis and a worker, started here as
    bench/service.py does; tasks go in with `POST /v1/tasks`.

Figures: per-step overhead (the gap between a task's consecutive model requests; the command
is `true`), one K-step task's wall (the package: its runner's elapsed for one row;
Sandhive: submit -> `task.finished` on the WebSocket), tasks/min with 16 and 32 tasks at once
(the package with as many workers; Sandhive's worker with as many slots, tasks submitted
together and timed from the first submit to the last `finished_at`), and submit -> first
model request and the K-step task's wall, cold (no warm pool) and warm (a pool of 2, full
before each submit). The
machine's busy CPU-s per task is printed with each throughput figure (it includes whatever
else runs: the load average is printed too). Each throughput phase starts once the machine
has been nearly idle for 3 s (`experiment.settle`, at most 90 s), so that neither side pays
for what the other left running (such as the kernel's teardown of the package's bridge
namespaces).

Last, the container's own floor in the same run (`bench/lifecycle.py`'s "no command at all"
variant for the runtime Sandhive used: a container of the same hardening created, started
and removed with nothing run in it, machine CPU per container, the median of three rounds)
at each concurrency of the throughput runs, and Sandhive's CPU-s per task at that
concurrency beside it: issue 35's goal is ≤ 1.5x.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
from redis.asyncio import Redis

from app.scripted import Script, Turn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lifecycle
from experiment import PACKAGE_IMAGE, PACKAGE_TASK, CpuMeter, package_cli, settle
from service import REDIS_URL, Bench, Cluster, ScriptedLLMProcess, bench_env
from stream_latency import create_database, drop_database

CONCURRENCY = (16, 32)


@dataclass
class Side:
    """One system's figures (seconds; throughput in tasks/min)."""

    gaps: list[float] = field(default_factory=list)
    k_wall: list[float] = field(default_factory=list)
    k_wall_warm: list[float] = field(default_factory=list)
    """The same task with a warm pool (a ready sandbox taken, none started)."""
    rate: dict[int, float] = field(default_factory=dict)
    cpu_per_task: dict[int, float] = field(default_factory=dict)
    load: dict[int, float] = field(default_factory=dict)
    by_process: dict[int, str] = field(default_factory=dict)
    """CPU-s by process group over each throughput run (bench/experiment.py's grouping)."""
    cold: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)
    errors: int = 0


def turns(steps: int) -> list[Turn]:
    bash = Turn(tool="execute_bash", arguments={"command": "true"})
    return [bash] * (steps - 1) + [Turn(tool="submit")]


def gaps_of(arrivals: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(arrivals)]


# The package


def package_run(
    cli: Path, llm: ScriptedLLMProcess, model: str, rows: int, workers: int, steps: int
) -> tuple[float, float, float]:
    """(its runner's elapsed s, machine CPU-s, load) for `rows` rows on `workers` workers."""
    llm.add_script(model, Script(turns=turns(steps)))
    with tempfile.TemporaryDirectory(prefix="sandhive-compare-pkg-") as out:
        argv = [
            str(cli),
            "benchmark",
            f"--task={PACKAGE_TASK}",
            f"--llm_name={model}",
            f"--llm_base_url={llm.base_url}",
            f"--docker_image={PACKAGE_IMAGE}",
            f"--num_workers={workers}",
            f"--max_steps={steps + 2}",
            "--start_id=0",
            f"--end_id={rows}",
            "--mode=llm-in-sandbox",
            f"--output_dir={out}",
        ]
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        if rows > 1:  # a throughput phase (Sandhive's singles run back to back too)
            settle()
        meter = CpuMeter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        cpu = meter.stop()
        results = sorted(Path(out).glob("*_LLMinSandbox/results.json"))
        if done.returncode != 0 or not results:
            sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
            raise RuntimeError(f"the package's benchmark failed: exit {done.returncode}")
        data = json.loads(results[-1].read_text())
        if int(data["num_errors"]):
            sys.stderr.write(f"package run {model}: {data['num_errors']} errors\n")
        return float(data["elapsed_time_seconds"]), cpu.busy_s, cpu.load


def run_package(cli: Path, llm: ScriptedLLMProcess, args: argparse.Namespace) -> Side:
    side = Side()
    for i in range(args.singles):
        model = f"pkg-single-{i}"
        elapsed, _, _ = package_run(cli, llm, model, 1, 1, args.steps)
        side.k_wall.append(elapsed)
        side.gaps += gaps_of(llm.arrivals(model))
    for n in CONCURRENCY:
        rows = n * args.rounds
        elapsed, cpu, load = package_run(cli, llm, f"pkg-{n}", rows, n, args.steps)
        side.rate[n] = rows / elapsed * 60
        side.cpu_per_task[n], side.load[n] = cpu / rows, load
    return side


# Sandhive


async def run_sandhive(llm: ScriptedLLMProcess, args: argparse.Namespace) -> Side:
    name = f"sandhive_bench_cmp_{os.getpid()}"
    database_url = await asyncio.to_thread(create_database, name)
    log_dir = Path(tempfile.mkdtemp(prefix="sandhive-bench-cmp-"))
    redis = Redis.from_url(REDIS_URL)
    await redis.flushdb()
    instance = f"bench-cmp-{os.getpid()}"
    env = bench_env(database_url, llm.base_url, instance)
    env.update(dict(setting.split("=", 1) for setting in args.env))
    cluster = Cluster(env, log_dir)
    side = Side()
    try:
        await cluster.start_api()
        async with httpx.AsyncClient(base_url=cluster.base_url, timeout=60) as client:
            bench = Bench(cluster, llm, client)
            cluster.start_worker("cmp-cold", concurrency=2, pool=0)
            await bench.warm_up()
            for _ in range(args.singles):
                await single(bench, side, args.steps)
            side.cold = bench.figures.starts.pop("cold", [])
            side.gaps = bench.figures.gaps.pop("cold, model latency 0 s", [])
            for n in CONCURRENCY:
                cluster.stop_worker()
                cluster.start_worker(f"cmp-{n}", concurrency=n, pool=0)
                await bench.warm_up()
                await throughput(bench, side, n, n * args.rounds, args.steps, database_url)
            cluster.stop_worker()
            cluster.start_worker("cmp-warm", concurrency=2, pool=2)
            await bench.warm_up()
            for _ in range(args.singles):
                await bench.wait_pool_filled(instance)
                await single(bench, side, args.steps, warm=True)
            side.warm = bench.figures.starts.pop("warm", [])
            side.errors = bench.figures.errors
        return side
    except Exception:
        sys.stderr.write(f"logs in {log_dir}\n")
        raise
    finally:
        cluster.stop()
        await redis.flushdb()
        await redis.aclose()
        await drop_database(name)


async def single(bench: Bench, side: Side, steps: int, *, warm: bool = False) -> None:
    """One K-step task: submit -> `task.finished` on its WebSocket, and its gaps; `warm`:
    the worker has a ready sandbox for it (its gaps are not counted again)."""
    model = bench.script(turns(steps))
    task_id, sent = await bench.submit(model, steps)
    status = await bench.follow(task_id, record=False)
    (side.k_wall_warm if warm else side.k_wall).append(time.monotonic() - sent)
    bench.figures.errors += status != "succeeded"
    arrivals = bench.llm.arrivals(model)
    bench.figures.starts.setdefault("warm" if warm else "cold", []).append(arrivals[0] - sent)
    if not warm:
        bench.figures.gaps.setdefault("cold, model latency 0 s", []).extend(gaps_of(arrivals))


async def throughput(
    bench: Bench, side: Side, n: int, total: int, steps: int, database_url: str
) -> None:
    """`total` tasks submitted at once to a worker of `n` slots, to the last one's end."""
    model = bench.script(turns(steps))
    await asyncio.to_thread(settle)
    meter = CpuMeter()
    started = time.time()
    ids = [(await bench.submit(model, steps))[0] for _ in range(total)]
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        while True:
            rows = await conn.fetch(
                "select status, finished_at from tasks where id = any($1::text[])", ids
            )
            if all(r["finished_at"] is not None for r in rows):
                break
            bench.cluster.check_alive()
            await asyncio.sleep(0.2)
    finally:
        await conn.close()
    cpu = meter.stop()
    wall = max(r["finished_at"].timestamp() for r in rows) - started
    bench.figures.errors += sum(r["status"] != "succeeded" for r in rows)
    side.rate[n] = total / wall * 60
    side.cpu_per_task[n], side.load[n] = cpu.busy_s / total, cpu.load
    side.by_process[n] = cpu.groups_line()


# Report


def med_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms" if values else "-"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def container_floor(args: argparse.Namespace) -> dict[int, float]:
    """Machine CPU-s of one bare container of our hardening, with the runtime Sandhive ran
    (`SANDHIVE_SANDBOX_RUNTIME` in --env), measured now at each throughput run's
    concurrency (a container's cost depends on how many start beside it): the median of
    three rounds of --floor-cycles (at least two waves); none with --floor-cycles 0."""
    if not args.floor_cycles:
        return {}
    runtime = dict(pair.split("=", 1) for pair in args.env).get("SANDHIVE_SANDBOX_RUNTIME")
    name = "no command at all, crun" if runtime == "crun" else "no command at all (the floor)"
    floors = {}
    for n in CONCURRENCY:
        only = argparse.Namespace(
            only=[name], cycles=max(args.floor_cycles, 2 * n), concurrency=n, rounds=3
        )
        rounds = asyncio.run(lifecycle.run(only))[name]
        floors[n] = statistics.median(r.cpu["total"] for r in rounds) / 1000
    return floors


def report(
    pkg: Side | None, sh: Side, args: argparse.Namespace, floors: dict[int, float] | None = None
) -> str:
    p = pkg or Side()
    k = args.steps
    med = statistics.median
    rows: list[tuple[str, str, str, str, str]] = [
        (
            "per-step overhead (median gap)",
            med_ms(p.gaps),
            med_ms(sh.gaps),
            ratio(med(sh.gaps) if sh.gaps else None, med(p.gaps) if p.gaps else None),
            "<= 3 ms",
        ),
        (
            f"one K={k} task, wall (median)",
            med_ms(p.k_wall),
            med_ms(sh.k_wall),
            ratio(med(sh.k_wall) if sh.k_wall else None, med(p.k_wall) if p.k_wall else None),
            "<= 0.4 s",
        ),
        (f"one K={k} task, wall, warm pool", "-", med_ms(sh.k_wall_warm), "", "<= 0.4 s"),
    ]
    for n, goal in zip(CONCURRENCY, ("5x", "6x"), strict=True):
        rows.append(
            (
                f"{n} concurrent K={k} tasks (tasks/min)",
                f"{p.rate.get(n, 0):.1f}" if n in p.rate else "-",
                f"{sh.rate.get(n, 0):.1f}",
                ratio(sh.rate.get(n), p.rate.get(n)),
                f">= {goal} the package",
            )
        )
        rows.append(
            (
                f"  machine CPU-s per task at {n} (load)",
                f"{p.cpu_per_task[n]:.2f} ({p.load[n]:.1f})" if n in p.rate else "-",
                f"{sh.cpu_per_task[n]:.2f} ({sh.load[n]:.1f})",
                "",
                "",
            )
        )
    for n, floor in (floors or {}).items():
        rows.append((f"a container's own floor at {n} (CPU-s)", "-", f"{floor:.2f}", "", ""))
        times = sh.cpu_per_task[n] / floor
        rows.append((f"  CPU per task at {n} / the floor", "-", f"{times:.2f}x", "", "<= 1.5x"))
    rows.append(("submit -> first model request, cold", "-", med_ms(sh.cold), "", "<= 150 ms"))
    rows.append(("submit -> first model request, warm", "-", med_ms(sh.warm), "", ""))
    head = ("figure", "package", "Sandhive", "Sandhive/package", "goal")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    lines = [
        " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [head, *rows]
    ]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    lines.append(
        f"\n{os.cpu_count()} CPUs, load average now {os.getloadavg()[0]:.1f}; singles "
        f"{args.singles}, {args.rounds} round(s) of tasks per concurrency; Sandhive errors "
        f"{sh.errors}" + (f"; settings {' '.join(args.env)}" if args.env else "")
    )
    for n, groups in sh.by_process.items():
        lines.append(f"Sandhive at {n}, CPU-s by process: {groups}")
    if pkg is None:
        lines.append("the package was not run (bench/package_setup.sh installs it)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="1 round, 3 singles")
    parser.add_argument("--steps", type=int, default=10, help="model turns per task (K)")
    parser.add_argument("--singles", type=int, default=10, help="single tasks for the medians")
    parser.add_argument("--rounds", type=int, default=3, help="tasks per concurrency slot")
    parser.add_argument("--package-venv", type=Path, default=Path(".bench-venv"))
    parser.add_argument("--no-package", action="store_true")
    parser.add_argument("--env", action="append", default=[], help="SANDHIVE_X=V for Sandhive")
    parser.add_argument(
        "--floor-cycles", type=int, default=16, help="bare containers for the floor (0: none)"
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.singles = 1, 3
    cli = None if args.no_package else package_cli(args.package_venv)
    if cli is None and not args.no_package:
        sys.stderr.write("no package in --package-venv: run bench/package_setup.sh first\n")
    with ScriptedLLMProcess() as llm:
        package = run_package(cli, llm, args) if cli is not None else None
        sandhive = asyncio.run(run_sandhive(llm, args))
    floors = container_floor(args)
    sys.stdout.write(report(package, sandhive, args, floors) + "\n")


if __name__ == "__main__":
    main()
