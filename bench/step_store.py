"""What storing one agent step costs the worker's process: CPU and wall per `save_step`.

    .venv/bin/python bench/step_store.py [--steps 2000] [--rounds 5]

A step's store is the worker's only Postgres write per step (`app.services.tasks.step_rows`)
and, write-behind (`app.worker.sink`), it costs the loop CPU rather than wall. Here it runs
alone, one step after another, on a scratch database and the bench's Redis: the process's
own CPU time (`time.process_time`, Postgres's and Redis's left out) and the wall per call,
the median over rounds. A step like a short one of the K=10 bench's: `execute_bash` of a
command with a one-line thought and a 200-byte observation, followed by the next
`step.started`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from redis.asyncio import Redis

from app.db import models
from app.db.engine import create_engine, create_sessions
from app.ids import new_task_id, utc_now
from app.schemas.tasks import ActionOut, StepOut
from app.services.tasks import attempts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import REDIS_URL, on_scratch_database


def a_step(index: int) -> StepOut:
    return StepOut(
        index=index,
        attempt=1,
        thought="Let me look at the files in the working directory first.",
        reasoning="",
        action=ActionOut(tool="execute_bash", arguments={"command": "ls -la /testbed"}),
        observation="x" * 200,
        exit_code=0,
        started_at=utc_now(),
        llm_ms=120,
        tool_ms=3,
        prompt_tokens=1500,
        completion_tokens=40,
    )


async def measure(database_url: str, steps: int, rounds: int) -> None:
    engine = create_engine(database_url)
    sessions = create_sessions(engine)
    redis = Redis.from_url(REDIS_URL)
    cpu_us: list[float] = []
    wall_us: list[float] = []
    try:
        for _ in range(rounds):
            task_id = new_task_id()
            async with sessions.begin() as session:
                session.add(
                    models.Task(
                        id=task_id,
                        tenant_id="bench",
                        status="running",
                        created_at=utc_now(),
                        prompt="p",
                        spec={},
                        meta={},
                        attempt=1,
                        usage={},
                        last_seq=0,
                    )
                )
            made = [a_step(i) for i in range(steps)]
            cpu, wall = time.process_time(), time.perf_counter()
            for step in made:
                await attempts.save_step(sessions, redis, task_id, step, step.index + 1)
            cpu_us.append((time.process_time() - cpu) / steps * 1e6)
            wall_us.append((time.perf_counter() - wall) / steps * 1e6)
    finally:
        await redis.aclose()
        await engine.dispose()
    sys.stdout.write(
        f"{steps} steps x {rounds} rounds, one after another\n"
        f"worker CPU per stored step: median {statistics.median(cpu_us):.0f} us\n"
        f"wall per stored step:       median {statistics.median(wall_us):.0f} us\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    async def run(database_url: str, _: Path) -> None:
        await measure(database_url, args.steps, args.rounds)

    on_scratch_database("steps", run)


if __name__ == "__main__":
    main()
