"""Peak memory of an experiment's results and of its JSONL export, by the number of items.

    .venv/bin/python bench/results_memory.py [--items 1000 10000] [--row-kib 64]

For each count: a scratch database (migrated to head) gets one experiment whose items each
carry a `row` of `--row-kib` KiB (a long-context row's documents), an answer and a
finished task; then `get_results` and the whole export (`open_experiment_export`, read to
its end) run in this process under `tracemalloc`, and the peak of Python allocations of
each is printed, with the dataset's size and what the two tables take on disk (the row is
stored once per experiment, not per item). The goal (issue #36): flat in the row size; the
export flat in the number of items too (a page at a time).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import time
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stream_latency import create_database, drop_database

from app.db.engine import create_engine, create_sessions
from app.services.experiments.results import get_results
from app.services.rollouts.export import open_experiment_export

TENANT = "bench"


async def fill(url: str, items: int, row_kib: int) -> str:
    """One experiment of `items` items (two arms), every one scored, each task finished."""
    exp_id = f"exp_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        spec = {
            "arms": [{"name": "a", "mode": "sandbox"}, {"name": "b", "mode": "vanilla"}],
            "scorer": {"kind": "exact"},
            "attempts": 1,
            "concurrency": 8,
        }
        await conn.execute(
            "INSERT INTO experiments (id, tenant_id, name, status, spec, metadata, created_at) "
            "VALUES ($1, $2, 'bench', 'finished', $3, '{}', now())",
            exp_id,
            TENANT,
            json.dumps(spec),
        )
        document = base64.b64encode(os.urandom(row_kib * 768)).decode()  # TOAST can't shrink it
        tasks, rows, dataset = [], [], []
        for seq in range(items):
            task_id = f"tsk_{uuid.uuid4().hex[:20]}"
            arm, row_id = ("a", "b")[seq % 2], f"r{seq // 2}"
            if arm == "a":
                row = {"id": row_id, "problem_statement": "p", "ground_truth": "1", "doc": document}
                dataset.append((exp_id, row_id, json.dumps(row)))
            tasks.append((task_id, TENANT, json.dumps({})))
            rows.append((exp_id, row_id, arm, seq, task_id, float(seq % 3 == 0)))
        await conn.executemany(
            "INSERT INTO experiment_rows (experiment_id, row_id, row) VALUES ($1, $2, $3)",
            dataset,
        )
        await conn.executemany(
            "INSERT INTO tasks (id, tenant_id, status, prompt, spec, metadata, attempt, usage, "
            "last_seq, finish_reason, answer, created_at, started_at, finished_at) "
            "VALUES ($1, $2, 'succeeded', 'p', $3, '{}', 1, '{}', 0, 'submitted', '1', now(), "
            "now(), now())",
            tasks,
        )
        await conn.executemany(
            "INSERT INTO experiment_items (experiment_id, row_id, arm, attempt, seq, "
            "task_id, status, score, answer, detail, updated_at, prompt_tokens, "
            "completion_tokens, steps, seconds, gradings, scoring_claims) "
            "VALUES ($1, $2, $3, 1, $4, $5, 'scored', $6, '1', '{}', now(), 0, 0, 0, 0, "
            "'[]', 0)",
            rows,
        )
    finally:
        await conn.close()
    return exp_id


async def peak(work: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """(peak MiB of Python allocations, seconds) of one call."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    started = time.perf_counter()
    await work()
    elapsed = time.perf_counter() - started
    _, top = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return top / 2**20, elapsed


async def measure(url: str, items: int, row_kib: int) -> tuple[float, ...]:
    exp_id = await fill(url, items, row_kib)
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        stored = await conn.fetchval(
            "SELECT pg_total_relation_size('experiment_rows') "
            "+ pg_total_relation_size('experiment_items')"
        )
    finally:
        await conn.close()
    engine = create_engine(url)
    sessions = create_sessions(engine)
    try:

        async def results() -> None:
            await get_results(sessions, TENANT, exp_id)

        async def export() -> None:
            async for _ in await open_experiment_export(sessions, TENANT, exp_id):
                pass

        await results()  # warm: the first call imports and compiles
        r_mib, r_s = await peak(results)
        e_mib, e_s = await peak(export)
    finally:
        await engine.dispose()
    return r_mib, r_s, e_mib, e_s, stored / 2**20


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--row-kib", type=int, default=64)
    args = parser.parse_args()
    say(f"rows of {args.row_kib} KiB; peak Python allocations (tracemalloc) and seconds")
    say(
        f"{'items':>7} {'results MiB':>12} {'results s':>10} {'export MiB':>11} {'export s':>9}"
        f" {'dataset MiB':>12} {'stored MiB':>11}"
    )
    for items in args.items:
        name = f"sandhive_bench_mem_{uuid.uuid4().hex[:8]}"
        url = create_database(name)
        try:
            r_mib, r_s, e_mib, e_s, stored = asyncio.run(measure(url, items, args.row_kib))
        finally:
            asyncio.run(drop_database(name))
        dataset = (items // 2) * args.row_kib / 1024  # two arms: a row per two items
        say(
            f"{items:>7} {r_mib:>12.1f} {r_s:>10.2f} {e_mib:>11.1f} {e_s:>9.2f}"
            f" {dataset:>12.1f} {stored:>11.1f}"
        )


if __name__ == "__main__":
    main()
