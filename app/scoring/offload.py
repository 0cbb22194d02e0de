"""Built-in scorers in worker processes, each answer under a deadline that kills.

A built-in scorer is pure CPU on untrusted text: the `math` scorer's SymPy work on a long
rambling answer, a tenant's `regex` backtracking on a model's answer, can take minutes.
Run on an event loop, that stalls every coroutine of the process: a worker's lease
renewals (past its lease other workers take its tasks and end its episodes as
`worker_lost`), an API process's every request. So the service never calls
`score_answer` on its loop: `score_off_loop` sends it to a pool of processes (pebble's
`ProcessPool`, which, unlike `concurrent.futures`, kills the one process whose task
outlived its timeout and starts another), and a timeout is that answer's scorer error.

One pool per process, made on first use with the settings it was first asked with
(`scoring_processes`, `scoring_timeout_s`). Its processes are forks of this one: they start
with the scorers (and SymPy) already imported and cost a fork, not an interpreter. Not
"spawn" or "forkserver": those run the parent's `__main__` again in every process (the
console script, the tests' zygote with the whole app), seconds of CPU each. A fork of a
threaded process is safe enough for what the child does: it runs one scorer, takes no lock
another thread could hold but the ones Python resets after a fork (logging's, imports').
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import multiprocessing
import os
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from pebble import ProcessPool

from app.scoring.types import Score, Scorer, ScorerError, score_answer

MAX_TASKS_PER_PROCESS = 500
"""A process is replaced after this many answers (whatever a library keeps, it keeps less)."""

_lock = threading.Lock()
_pool: ProcessPool | None = None

Outcome = tuple[str, Any, dict[str, Any]]
"""("score", value, detail) or ("error", message, detail): plain data across the pipe."""


def _run(scorer: Scorer, answer: str | None, row: Mapping[str, Any]) -> Outcome:
    """In a pool process: the score, or the scorer's error, as plain data."""
    try:
        score = score_answer(scorer, answer, row)
    except ScorerError as exc:
        return ("error", exc.message, exc.detail)
    return ("score", score.value, score.detail)


def _the_pool(processes: int) -> ProcessPool:
    global _pool
    with _lock:
        if _pool is None or not _pool.active:
            context = multiprocessing.get_context("fork")
            _pool = ProcessPool(
                max_workers=processes, max_tasks=MAX_TASKS_PER_PROCESS, context=context
            )
        return _pool


def close() -> None:
    """Stop this process's pool (at exit, and for tests); the next use makes a new one."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.stop()  # type: ignore[no-untyped-call]  # pebble leaves it unannotated
        pool.join(timeout=5)


def _forget_in_child() -> None:
    """A forked child (the tests' zygote forks app processes) has its parent's pool object
    but none of its processes or threads: it makes its own on first use."""
    global _lock, _pool
    _lock, _pool = threading.Lock(), None


atexit.register(close)
os.register_at_fork(after_in_child=_forget_in_child)


class PoolSettings(Protocol):
    """What the pool reads of the settings (`app.config.Settings` has both)."""

    @property
    def scoring_processes(self) -> int: ...
    @property
    def scoring_timeout_s(self) -> float: ...


async def score_off_loop(
    scorer: Scorer, answer: str | None, row: Mapping[str, Any], settings: PoolSettings
) -> Score:
    """`score_answer` in a pool process: its Score, or ScorerError (its own, a timeout, or
    a process that died). Cancelling the caller kills the run."""
    # A scorer's own bound (the math scorer's `timeout_s`) is per step: it may ask for more.
    timeout_s = max(settings.scoring_timeout_s, float(getattr(scorer, "timeout_s", 0) or 0))
    # In a thread: the first call starts the pool's processes, which would otherwise block
    # this loop (a fork of a large process takes a while). A pool that cannot start
    # raises here: the infrastructure's failure, the caller's to retry, not a verdict.
    future: concurrent.futures.Future[Outcome] = await asyncio.to_thread(
        _the_pool(settings.scoring_processes).schedule,
        _run,
        args=(scorer, answer, dict(row)),
        timeout=timeout_s,
    )
    try:
        kind, value, detail = await asyncio.wrap_future(future)
    except concurrent.futures.TimeoutError:
        raise ScorerError(
            f"scorer {scorer.kind!r} took longer than {timeout_s:g} s on this answer "
            "(SANDHIVE_SCORING_TIMEOUT_S)",
            {"timeout_s": timeout_s},
        ) from None
    except asyncio.CancelledError:
        future.cancel()
        raise
    except Exception as exc:  # the process died (out of memory, killed): this answer's error
        raise ScorerError(
            f"scorer {scorer.kind!r} failed: {type(exc).__name__}: {exc}"[:1000],
            {"exception": type(exc).__name__},
        ) from None
    if kind == "error":
        raise ScorerError(str(value), detail)
    return Score(float(value), detail)
