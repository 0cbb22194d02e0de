"""Where one agent step's wall time goes, by phase, through the whole service.

    SANDHIVE_BENCH_REDIS_URL=redis://127.0.0.1:6379/1 .venv/bin/python bench/step_phases.py
        [--tasks 10] [--steps 10] [--loop uvloop|asyncio]

The API runs as a process of its own and the scripted model in another (bench/service.py,
TCP_NODELAY, instant answers: K-1 `execute_bash` of `true`, then `submit`); the worker runs
in this process, one task at a time, with the functions that bound each phase of a step
wrapped to note `time.monotonic()` as they start and end (the same clock as the model
server's arrival times). Per step, from the model's last byte to the arrival of the next
request at the model server:

  parse        the answer made a Completion (`OpenAIChatModel._parse`)
  tool         the tool call (`run_tool`), of it:
    channel    the command's round trip through the sandbox's exec channel
               (`ExecChannel.exec`: to the agent in the container, `true`, its answer)
  sink         the step handed to the write-behind sink (`TaskSink.step_completed`,
               `step_started`; live events: `TaskSink.live`)
  build        the next request's body (`OpenAIChatModel.build_body`)
  send         body serialised and sent, until the model server notes its arrival
  the rest     the loop's own Python between those, and whatever else the event loop ran
               then (the write-behind store of the step before, live publishes)

and, overlapping the next step rather than in it: the store (`attempts.save_step`: one SQL
statement and one Redis pipeline, in the sink's writer task). Also the answer's way back
(the model server's arrival to our last byte: the stand-in's own time and our read), and the
worker process's CPU per step (`time.process_time` from one request's start to the next's:
the store's CPU falls in it, the task's start and end do not). Medians over the tasks'
`execute_bash` steps but each task's first, whose command waits for its sandbox to start.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvloop
from redis.asyncio import Redis

from app.agent import loop
from app.config import Settings
from app.llm.openai import OpenAIChatModel
from app.sandbox.channel import ExecChannel
from app.scripted import Script, Turn
from app.services.tasks import attempts
from app.worker import sink
from app.worker.pool import Worker

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import REDIS_URL, Cluster, ScriptedLLMProcess, bench_env, on_scratch_database

Spans = dict[str, list[tuple[float, float]]]


def timed(spans: Spans, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (sync or async), noting each call's (start, end) under `phase`."""
    if asyncio.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            if phase == "exchange":
                spans["cpu"].append((start, time.process_time()))
            try:
                return await fn(*args, **kwargs)
            finally:
                spans[phase].append((start, time.monotonic()))

        return run_async

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            spans[phase].append((start, time.monotonic()))

    return run


def instrument(spans: Spans) -> None:
    """Wrap the phases' functions where the worker looks them up."""
    OpenAIChatModel._attempt = timed(spans, "exchange", OpenAIChatModel._attempt)  # type: ignore[method-assign]
    OpenAIChatModel._parse = timed(spans, "parse", OpenAIChatModel._parse)  # type: ignore[method-assign]
    OpenAIChatModel.build_body = timed(spans, "build", OpenAIChatModel.build_body)  # type: ignore[method-assign]
    loop.run_tool = timed(spans, "tool", loop.run_tool)  # type: ignore[attr-defined]
    ExecChannel.exec = timed(spans, "channel", ExecChannel.exec)  # type: ignore[method-assign]
    for name in ("step_completed", "step_started", "live"):
        setattr(sink.TaskSink, name, timed(spans, "sink", getattr(sink.TaskSink, name)))
    attempts.save_step = timed(spans, "store", attempts.save_step)


def within(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of `spans` inside [start, end]."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)


def split(spans: Spans, arrivals: list[float]) -> list[dict[str, float]]:
    """Per step (between consecutive model requests): each phase's ms in its window."""
    steps = []
    for sent, arrived in itertools.pairwise(arrivals):
        # the exchange that the request at `sent` began: its end is the model's last byte
        last_byte = min(b for a, b in spans["exchange"] if a <= sent <= b + 1e-3)
        window = arrived - last_byte
        phases = {
            p: within(spans[p], last_byte, arrived) for p in ("parse", "tool", "sink", "build")
        }
        send_start = max(a for a, _ in spans["exchange"] if a <= arrived)
        phases["send"] = arrived - send_start
        phases["rest"] = window - sum(phases.values())
        phases["  tool: channel"] = within(spans["channel"], last_byte, arrived)
        phases["store (overlapping)"] = within(spans["store"], last_byte, arrived)
        phases["window"] = window
        phases["answer's way back"] = last_byte - sent
        phases["gap between requests"] = arrived - sent
        cpu = dict(spans["cpu"])  # an exchange's start -> the process's CPU time then
        began = max(a for a, _ in spans["exchange"] if a <= sent)
        phases["worker CPU"] = cpu[send_start] - cpu[began]
        steps.append({k: v * 1000 for k, v in phases.items()})
    # The first gap's command waits for the sandbox to start; the last leads to `submit`.
    return steps[1:-1]


async def measure(args: argparse.Namespace, database_url: str, log_dir: Path) -> None:
    redis = Redis.from_url(REDIS_URL)
    await redis.flushdb()
    with ScriptedLLMProcess() as llm:
        env = bench_env(database_url, llm.base_url, f"bench-{os.getpid()}")
        cluster = Cluster(env, log_dir)
        os.environ.update(env)
        settings = Settings(worker_concurrency=1, warm_pool_size=0)
        spans: Spans = defaultdict(list)
        instrument(spans)
        rows: list[dict[str, float]] = []
        try:
            await cluster.start_api()
            async with httpx.AsyncClient(base_url=cluster.base_url, timeout=60) as client:
                for number in range(args.tasks + 1):  # the first warms up, not counted
                    model = f"phases-{number}"
                    turns = [Turn("execute_bash", {"command": "true"})] * (args.steps - 1)
                    llm.add_script(model, Script([*turns, Turn("submit", {})]))
                    body = {"prompt": "p", "llm": {"model": model}}
                    body["limits"] = {"max_steps": args.steps + 1}
                    created = await client.post("/v1/tasks", json=body)
                    created.raise_for_status()
                    spans.clear()
                    await Worker(settings).run(burst=True)
                    task = (await client.get(f"/v1/tasks/{created.json()['id']}")).json()
                    if task["status"] != "succeeded":
                        raise RuntimeError(f"task ended {task['status']}: {task}")
                    if number:
                        rows.extend(split(spans, llm.arrivals(model)))
        finally:
            cluster.stop()
            await redis.flushdb()
            await redis.aclose()
    report(rows, args)


def report(rows: list[dict[str, float]], args: Any) -> None:
    out = [f"{args.tasks} tasks of {args.steps} steps, one at a time; {len(rows)} steps", ""]
    out.append(f"{'phase':<34} {'median ms':>10} {'p90 ms':>8}")
    for key in rows[0]:
        values = sorted(row[key] for row in rows)
        p90 = values[int(0.9 * (len(values) - 1))]
        out.append(f"{key:<34} {statistics.median(values):>10.2f} {p90:>8.2f}")
    sys.stdout.write("\n".join(out) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--loop",
        choices=["uvloop", "asyncio"],
        default="uvloop",
        help="the worker's event loop (SANDHIVE_WORKER_EVENT_LOOP; the API's is uvicorn's)",
    )
    args = parser.parse_args()

    async def run(database_url: str, log_dir: Path) -> None:
        await measure(args, database_url, log_dir)

    on_scratch_database("phases", run, uvloop.new_event_loop if args.loop == "uvloop" else None)


if __name__ == "__main__":
    main()
