"""Step-to-viewer latency of the live event stream, with 1 and with 100 WebSocket viewers.

    .venv/bin/python bench/stream_latency.py [--steps 200] [--interval 0.05] [--viewers 1 100]

What it measures: a writer process runs a task's steps through the worker's own
path (`start_attempt`, then the worker's `TaskSink`: one fenced transaction per
step via `attempts.save_step`, committed to Postgres, then published to Redis)
and stamps each step with the wall-clock time at which it hands the step to the
sink, as the agent loop does; the viewers, WebSocket clients of a real
`sandhive serve` process, note when each `step.completed` reaches them. Latency =
arrival - stamp, over every (viewer, step) pair; median and p99 are printed.

Needs Postgres and Redis like the tests: it creates (and drops) a scratch
database `sandhive_bench_<pid>` through SANDHIVE_BENCH_ADMIN_URL (default
postgresql://postgres@127.0.0.1:5432/postgres) and uses SANDHIVE_BENCH_REDIS_URL
(default redis://127.0.0.1:6379/12), which it empties before and after. Writer,
viewers and API share this machine's cores, so the figures include that contention.
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

import asyncpg
import httpx
import websockets
from alembic import command
from alembic.config import Config
from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parent.parent
ADMIN_URL = os.environ.get(
    "SANDHIVE_BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("SANDHIVE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
FILLER = "x" * 800  # a step.completed event of about 1.5 KB, like a short real step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps written per run")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between steps")
    parser.add_argument("--viewers", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--write", help=argparse.SUPPRESS)  # internal: the writer process
    args = parser.parse_args()
    if args.write:
        asyncio.run(write_steps(args.write, args.steps, args.interval))
        return
    name = f"sandhive_bench_{os.getpid()}"
    database_url = create_database(name)
    try:
        asyncio.run(run_all(database_url, args))
    finally:
        asyncio.run(drop_database(name))


def create_database(name: str) -> str:
    """A fresh database migrated to head (Alembic runs its own event loop)."""

    async def create() -> None:
        conn = await asyncpg.connect(ADMIN_URL)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    url = ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://") + "/" + name
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "migrations"))
    config.set_main_option("sqlalchemy.url", url)
    command.upgrade(config, "head")
    return url


async def drop_database(name: str) -> None:
    conn = await asyncpg.connect(ADMIN_URL)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def service_env(database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHIVE_")}
    env.update(
        SANDHIVE_DATABASE_URL=database_url,
        SANDHIVE_REDIS_URL=REDIS_URL,
        SANDHIVE_LLM_BASE_URL="http://127.0.0.1:9/v1",  # never called: no worker runs
        SANDHIVE_LLM_MODEL="bench",
        SANDHIVE_RATE_LIMIT_PER_S="0",  # 100 viewers connect at once
        SANDHIVE_AUTH="disabled",
    )
    return env


async def run_all(database_url: str, args: argparse.Namespace) -> None:
    redis = Redis.from_url(REDIS_URL)
    await redis.flushdb()
    env = service_env(database_url)
    port = free_port()
    api = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "app", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base_url = f"http://127.0.0.1:{port}"
        await wait_ready(base_url)
        report(f"{args.steps} steps, one every {args.interval * 1000:.0f} ms, per run")
        report("ms from the worker's sink getting a step to a viewer receiving it;")
        report("write = the sink's transaction + publish alone (part of that latency)")
        report(
            f"{'viewers':>8} {'samples':>8} {'median':>8} {'p99':>8} {'max':>8}"
            f" {'write median':>14} {'write p99':>11}"
        )
        for viewers in args.viewers:
            latencies, writes = await one_run(base_url, env, viewers, args)
            report(
                f"{viewers:>8} {len(latencies):>8} {statistics.median(latencies):>8.1f}"
                f" {p99(latencies):>8.1f} {max(latencies):>8.1f}"
                f" {statistics.median(writes):>14.1f} {p99(writes):>11.1f}"
            )
    finally:
        api.terminate()
        await api.wait()
        await redis.flushdb()
        await redis.aclose()


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def report(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_ready(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=1) as client:
        for _ in range(150):
            try:
                if (await client.get("/readyz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError("the API did not become ready")


async def one_run(
    base_url: str, env: dict[str, str], viewers: int, args: argparse.Namespace
) -> tuple[list[float], list[float]]:
    """Latencies in ms of every step at every viewer, and the writer's write times."""
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        created = await client.post("/v1/tasks", json={"prompt": "latency benchmark"})
        created.raise_for_status()
        task_id = created.json()["id"]
    ws_url = base_url.replace("http://", "ws://") + f"/v1/tasks/{task_id}/stream?after=0"
    following = [asyncio.Event() for _ in range(viewers)]
    watchers = [asyncio.create_task(watch(ws_url, ready)) for ready in following]
    await asyncio.wait_for(asyncio.gather(*(ready.wait() for ready in following)), 60)
    writer = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--write",
        task_id,
        "--steps",
        str(args.steps),
        "--interval",
        str(args.interval),
        env=env,
        stdout=subprocess.PIPE,
    )
    out, _ = await writer.communicate()
    results = await asyncio.gather(*watchers)
    writes = json.loads(out)["write_ms"]
    return [latency for result in results for latency in result], writes


async def watch(url: str, following: asyncio.Event) -> list[float]:
    """One viewer: milliseconds from each step's stamp to its arrival here."""
    latencies: list[float] = []
    async with websockets.connect(url, max_size=None) as ws:
        async for message in ws:
            arrived = time.time()
            event = json.loads(message)
            if event["type"] == "task.queued":
                following.set()
            elif event["type"] == "step.completed":
                stamp = float(event["data"]["observation"].split(" ", 1)[0])
                latencies.append((arrived - stamp) * 1000)
            elif event["type"] == "task.finished":
                break
    return latencies


async def write_steps(task_id: str, steps: int, interval: float) -> None:
    """The writer: the worker's own path for a task's steps, stamped as each is handed over.

    Like `app.worker.attempt`: `start_attempt` makes the task running as attempt 1,
    a `TaskSink` records the steps (the agent loop's calls: `step_started(0)`, then
    `step_completed(step, next_index)`, each one fenced transaction, published after
    the commit, written behind by the sink's writer task), then `finish_task`. The
    stamp is taken when the step is handed to the sink, as the loop does.
    """
    from app.agent.types import Action, Step
    from app.db.engine import create_engine, create_sessions
    from app.ids import utc_now
    from app.schemas.tasks import UsageOut
    from app.services.tasks import attempts, lifecycle
    from app.states import FinishReason
    from app.worker.sink import TaskSink

    engine = create_engine(os.environ["SANDHIVE_DATABASE_URL"])
    sessions = create_sessions(engine)
    redis = Redis.from_url(os.environ["SANDHIVE_REDIS_URL"])
    write_ms: list[float] = []
    try:
        started = await attempts.start_attempt(
            sessions, redis, task_id, "bench-writer", max_attempts=1
        )
        if started is None or started.attempt != 1:
            raise RuntimeError(f"{task_id} did not start as attempt 1: {started}")
        sink = TaskSink(sessions, redis, task_id, started.attempt)
        try:
            await sink.step_started(0)
            for index in range(steps):
                stamp = time.time()
                step = Step(
                    index=index,
                    started_at=utc_now(),
                    thought="Run the next command.",
                    action=Action("bash", {"command": f"echo {index}"}),
                    observation=f"{stamp:.6f} {FILLER}",
                    exit_code=0,
                    llm_ms=40,
                    tool_ms=10,
                    prompt_tokens=1200,
                    completion_tokens=40,
                )
                await sink.step_completed(step, index + 1 if index + 1 < steps else None)
                # Not what the worker does per step, but at this pace the sink's queue is
                # empty by the next step anyway: it times the write (commit + publish).
                await sink.flush()
                write_ms.append((time.time() - stamp) * 1000)
                await asyncio.sleep(interval)
            await sink.flush()
        finally:
            await sink.close()
        end = lifecycle.TaskEnd(FinishReason.submitted, answer="done", usage=UsageOut(steps=steps))
        await attempts.finish_task(sessions, redis, task_id, started.attempt, end)
        sys.stdout.write(json.dumps({"write_ms": write_ms}))
    finally:
        await redis.aclose()
        await engine.dispose()


if __name__ == "__main__":
    main()
