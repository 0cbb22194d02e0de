"""Sandhive's own overhead per task and per step, with an instant (or fixed-latency) model.

    .venv/bin/python bench/overhead.py [--tasks 10] [--steps 10] [--latency 0 0.5]
                                       [--concurrency 1 8 32] [--no-channel]
                                       [--runtimes runc crun ...] [--runtimes-only]

What it measures, on the episode path the worker and `sandhive run` share
(`app.runner.episode.Runner`: sandbox start, inputs, agent loop, tools, collection,
removal; the queue and Postgres are not in it):
  * start: episode start to the first LLM request (median, p95), cold sandboxes and,
    when the warm pool exists (`app.sandbox.pool`), claimed from a warm pool;
  * step: time between two consecutive LLM requests of a task minus the model's own
    latency, with `true` as the command (median, p95) — Sandhive's per-step overhead;
  * throughput: tasks/min of N concurrent tasks of --steps steps, with host CPU and
    memory use during the run;
  * idle sandbox memory: cgroup memory usage of a started, never-used sandbox;
  * start per OCI runtime (`SANDHIVE_SANDBOX_RUNTIME`; by default every runtime the daemon
    registers, `docker info`'s Runtimes): create + start + set-up of a sandbox until its
    first command (`true`) answers (median, p95 of --tasks); a runtime that cannot start
    a sandbox on this host shows its error instead.
The model is in-process (no HTTP), so only Sandhive's own costs are counted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.agent.types import Completion, Step, ToolCall
from app.config import Settings
from app.domain.resolve import resolve_spec
from app.errors import SandboxError
from app.runner.episode import Runner
from app.sandbox.docker import DockerHost
from app.sandbox.policy import SandboxConfig
from app.sandbox.pool import WarmPool
from app.schemas.tasks import TaskCreate
from app.specs import TaskSpec

SETTINGS = Settings(
    _env_file=None,
    sandbox_image="sandhive-sandbox:latest",
    llm_base_url="http://127.0.0.1:9/v1",  # a profile to resolve against; never called
    llm_model="bench",
)
INPUTS = [("in.txt", b"hello\n")]


@dataclass
class TimedModel:
    """Answers `execute_bash true` until the last step, then submit; notes each request time."""

    steps: int
    latency_s: float
    times: list[float] = field(default_factory=list)

    async def complete(
        self, messages: Sequence[Any], tools: Any, on_delta: Any = None
    ) -> Completion:
        self.times.append(time.perf_counter())
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        n = len(self.times)
        name, args = ("submit", "{}") if n >= self.steps else ("execute_bash", '{"command":"true"}')
        call = ToolCall(
            id=f"c{n}",
            name=name,
            arguments={} if name == "submit" else {"command": "true"},
            raw_arguments=args,
        )
        message = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": name, "arguments": args}}
            ],
        }
        return Completion(message=message, tool_calls=(call,))


class NullSink:
    async def step_started(self, index: int) -> None:
        return None

    async def step_completed(self, step: Step, next_index: int | None = None) -> None:
        return None

    async def live(self, kind: str, data: Mapping[str, object]) -> None:
        return None


@dataclass
class TaskTimes:
    started: float
    model: TimedModel
    ok: bool


def task(steps: int) -> TaskSpec:
    body = {"prompt": "bench", "limits": {"max_steps": steps + 5}}
    box = {"memory_mb": 512, "disk_mb": 64}
    return resolve_spec(TaskCreate.model_validate({**body, "sandbox": box}), SETTINGS)


def shape(host: DockerHost, labels: Mapping[str, str]) -> SandboxConfig:
    return Runner(SETTINGS, host).episode(task(1), "bench", labels=labels).sandbox


async def one_task(
    host: DockerHost,
    labels: Mapping[str, str],
    steps: int,
    latency: float,
    pool: WarmPool | None = None,
) -> TaskTimes:
    model = TimedModel(steps, latency)
    runner = Runner(SETTINGS, host, pool=pool)
    started = time.perf_counter()
    result = await runner.run(
        task(steps), "bench", NullSink(), labels=labels, inputs=INPUTS, model=model
    )
    return TaskTimes(started, model, result.outcome.error is None)


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values) * 1000:8.1f} {pct(values, 0.95) * 1000:8.1f}"


def cpu_sample() -> tuple[float, float]:
    with open("/proc/stat") as f:
        parts = [float(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


def mem_used_mb() -> float:
    info: dict[str, float] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = float(value.split()[0])
    return (info["MemTotal"] - info["MemAvailable"]) / 1024


async def idle_memory_mb(host: DockerHost, labels: Mapping[str, str]) -> float:
    box = await host.create_sandbox(shape(host, labels))
    try:
        await asyncio.sleep(1.0)
        stats = await host.api().containers.container(box.id).stats(stream=False)
        item = stats[0] if isinstance(stats, list) else stats
        memory = item["memory_stats"]
        cache = memory.get("stats", {}).get("inactive_file", 0)
        return float(memory["usage"] - cache) / 2**20
    finally:
        await box.remove()


async def registered_runtimes() -> list[str]:
    """The OCI runtimes the daemon knows (`docker info`'s Runtimes)."""
    async with DockerHost() as host:
        info = await host.api().system.info()
    return sorted(info.get("Runtimes") or {})


async def runtime_start(runtime: str, count: int, labels: Mapping[str, str]) -> str:
    """Create + start + set-up until the first command answers, `count` times (after one
    not counted); the error, on one line, when the runtime cannot start a sandbox here."""
    settings = SETTINGS.model_copy(update={"sandbox_runtime": runtime})
    times: list[float] = []
    async with DockerHost(runtime=runtime) as host:
        config = Runner(settings, host).episode(task(1), "bench", labels=labels).sandbox
        try:
            await host.ping()
            for _ in range(count + 1):
                began = time.perf_counter()
                box = await host.create_sandbox(config)
                try:
                    done = await box.exec(["true"])
                    took = time.perf_counter() - began
                finally:
                    await box.remove()
                if done.exit_code != 0:
                    return f"error: `true` exited {done.exit_code}"
                times.append(took)
        except SandboxError as exc:
            return "error: " + " ".join(exc.message.split())[:160]
    return ms(times[1:])


async def runtime_rows(
    runtimes: Sequence[str], count: int, labels: Mapping[str, str]
) -> list[tuple[str, str]]:
    return [
        (f"start cold, runtime {runtime} (ms med/p95)", await runtime_start(runtime, count, labels))
        for runtime in runtimes
    ]


async def run(args: argparse.Namespace) -> None:
    # A task label, as every sandbox has: test sessions running meanwhile audit all of them.
    labels = {"sandhive.bench": uuid.uuid4().hex, "sandhive.task": "bench"}
    rows = [] if args.runtimes_only else await general_rows(args, labels)
    runtimes = args.runtimes or await registered_runtimes()
    rows += await runtime_rows(runtimes, args.tasks, labels)
    width = max(len(r[0]) for r in rows)
    lines = [f"{'measure':<{width}}  value"] + [f"{n:<{width}}  {v}" for n, v in rows]
    sys.stdout.write("\n".join(lines) + "\n")


async def general_rows(
    args: argparse.Namespace, labels: Mapping[str, str]
) -> list[tuple[str, str]]:
    """Start, step overhead, warm pool, throughput, idle memory (the default runtime)."""
    rows: list[tuple[str, str]] = []
    async with DockerHost(exec_channel=not args.no_channel) as host:
        try:
            await one_task(host, labels, 2, 0.0)  # warm the image cache and the client
            for latency in args.latency:
                times = [
                    await one_task(host, labels, args.steps, latency) for _ in range(args.tasks)
                ]
                starts = [t.model.times[0] - t.started for t in times]
                gaps = [
                    b - a - latency
                    for t in times
                    for a, b in zip(t.model.times, t.model.times[1:], strict=False)
                ]
                rows.append((f"start cold, latency {latency:g}s (ms med/p95)", ms(starts)))
                rows.append((f"step overhead, latency {latency:g}s (ms med/p95)", ms(gaps)))
            warm = WarmPool(host, size=2, labels=labels)
            ready = shape(host, labels)
            warm.start(ready)
            starts = []
            for _ in range(args.tasks):
                await warm.wait_ready(ready)
                t = await one_task(host, labels, args.steps, 0.0, pool=warm)
                starts.append(t.model.times[0] - t.started)
            await warm.close()
            rows.append(("start warm pool, latency 0s (ms med/p95)", ms(starts)))
            for n in args.concurrency:
                cpu0, mem0 = cpu_sample(), mem_used_mb()
                began = time.perf_counter()
                results = await asyncio.gather(
                    *(one_task(host, labels, args.steps, 0.0) for _ in range(n))
                )
                took = time.perf_counter() - began
                cpu1, mem1 = cpu_sample(), mem_used_mb()
                busy = 100 * (cpu1[0] - cpu0[0]) / max(cpu1[1] - cpu0[1], 1)
                errors = sum(not r.ok for r in results)
                rows.append(
                    (
                        f"throughput {n} x {args.steps}-step tasks",
                        f"{n / took * 60:8.1f}/min cpu {busy:3.0f}% mem {mem1:6.0f}MB "
                        f"(+{mem1 - mem0:.0f}) errors {errors}",
                    )
                )
            rows.append(("idle sandbox memory (MB)", f"{await idle_memory_mb(host, labels):8.1f}"))
        finally:
            for container_id in await host.list_sandboxes(labels):
                await host.remove_container(container_id)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--tasks", type=int, default=10, help="sequential tasks per latency")
    parser.add_argument("--steps", type=int, default=10, help="LLM turns per task")
    parser.add_argument("--latency", type=float, nargs="+", default=[0.0, 0.5])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--no-channel", action="store_true", help="a `docker exec` per command")
    parser.add_argument(
        "--runtimes", nargs="+", default=None, help="OCI runtimes to time (default: all registered)"
    )
    parser.add_argument("--runtimes-only", action="store_true", help="only the per-runtime start")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
