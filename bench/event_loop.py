"""The worker's kind of round trips on uvloop and on the standard library's asyncio loop.

    SANDHIVE_BENCH_REDIS_URL=redis://127.0.0.1:6379/1 .venv/bin/python bench/event_loop.py
        [--iterations 1500] [--rounds 8]

One iteration is what a step's store and live events send, in the shapes the worker sends
them: a Redis pipeline (a PUBLISH and an XADD), one asyncpg statement with a parameter, and a
Redis GET beside a `SELECT 1` at once. Each round runs the iterations on a fresh loop of each
kind, the two kinds alternated so that the machine's drift falls on both; printed, per
iteration, this process's CPU (`time.process_time`) and wall, the median over the rounds.
Only this process's side is measured: Redis and Postgres are the same servers for both.

Needs Postgres (SANDHIVE_BENCH_ADMIN_URL, default postgresql://postgres@127.0.0.1:5432/postgres)
and Redis (SANDHIVE_BENCH_REDIS_URL, default redis://127.0.0.1:6379/12; a scratch key and
stream, deleted afterwards).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import asyncpg
import uvloop
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stream_latency import ADMIN_URL, REDIS_URL

KEY = "sandhive-bench-event-loop"
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop] | None] = {
    "asyncio": None,  # asyncio.Runner's own
    "uvloop": uvloop.new_event_loop,
}


async def round_trips(iterations: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per iteration, after a warm-up of 100."""
    redis = Redis.from_url(REDIS_URL)
    postgres = await asyncpg.connect(ADMIN_URL)
    try:

        async def once() -> None:
            async with redis.pipeline(transaction=False) as pipe:
                pipe.publish(KEY, b"e" * 200)
                pipe.xadd(KEY, {"event": "step"}, maxlen=100)
                await pipe.execute()
            await postgres.fetchval("SELECT $1::text", "s" * 300)
            await asyncio.gather(redis.get(f"{KEY}:flag"), postgres.fetchval("SELECT 1"))

        for _ in range(100):
            await once()
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(iterations):
            await once()
        return (
            (time.process_time() - cpu) / iterations * 1e6,
            (time.perf_counter() - wall) / iterations * 1e6,
        )
    finally:
        await redis.delete(KEY)
        await redis.aclose()
        await postgres.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in LOOPS}
    for _ in range(args.rounds):
        for name, factory in LOOPS.items():
            with asyncio.Runner(loop_factory=factory) as runner:
                figures[name].append(runner.run(round_trips(args.iterations)))
    out = [
        f"{args.rounds} rounds of {args.iterations} iterations, the loops alternated",
        f"{'loop':<8} {'CPU µs/iter':>12} {'wall µs/iter':>13}  CPU of each round",
    ]
    for name, rows in figures.items():
        cpu = statistics.median(c for c, _ in rows)
        wall = statistics.median(w for _, w in rows)
        each = " ".join(f"{c:.0f}" for c, _ in rows)
        out.append(f"{name:<8} {cpu:>12.0f} {wall:>13.0f}  {each}")
    base, fast = (statistics.median(c for c, _ in figures[n]) for n in LOOPS)
    out.append(f"uvloop / asyncio, CPU: {fast / base:.2f}")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
