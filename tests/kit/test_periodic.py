"""Background loops end when asked, even when a job swallowed its cancel (`app.kit.periodic`).

Found by a worker SIGTERMed just after it started: its heartbeat chore's first
run swallowed the cancel, the chore slept on, and the worker hung until SIGKILL.
The swallowing job below plays that library; nothing of Sandhive is replaced.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from app.kit.periodic import Periodic

STOP_WITHIN_S = 5.0


async def test_a_chore_whose_job_swallowed_the_cancel_still_ends() -> None:
    entered = asyncio.Event()
    runs = 0

    async def swallowing_job() -> None:
        nonlocal runs
        runs += 1
        entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # what asyncio.wait_for racing a cancel does on Python 3.11 (gh-86296)

    loops = Periodic()
    loops.start(3600.0, "swallower", swallowing_job)
    await entered.wait()
    async with asyncio.timeout(STOP_WITHIN_S):
        await loops.stop()  # cancel alone would leave it asleep for the hour
    assert runs == 1, "no run started after the stop"


async def test_a_failing_job_is_logged_and_runs_again_until_stopped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs = 0
    three = asyncio.Event()

    async def failing_job() -> None:
        nonlocal runs
        runs += 1
        if runs == 3:
            three.set()
        raise RedisConnectionError("redis is away")

    loops = Periodic()
    loops.start(0.01, "flaky", failing_job)
    async with asyncio.timeout(STOP_WITHIN_S):
        await three.wait()
        await loops.stop()
    stopped_at = runs
    await asyncio.sleep(0.05)
    assert runs == stopped_at, "nothing runs after stop()"
    failures = [r for r in caplog.records if r.getMessage().startswith("background job 'flaky'")]
    assert len(failures) == stopped_at, "every failed run logged, none fatal"


async def test_a_loop_started_later_waits_one_interval_first() -> None:
    runs = 0

    async def job() -> None:
        nonlocal runs
        runs += 1

    loops = Periodic()
    loops.start(0.2, "later", job, now=False)
    await asyncio.sleep(0.05)
    assert runs == 0, "nothing before the first interval"
    await asyncio.sleep(0.3)
    assert runs >= 1, "a run after it"
    async with asyncio.timeout(STOP_WITHIN_S):
        await loops.stop()


async def test_a_wake_runs_the_job_at_once_and_several_wakes_make_one_run() -> None:
    runs: list[float] = []
    ran = asyncio.Event()

    async def job() -> None:
        runs.append(asyncio.get_running_loop().time())
        ran.set()

    wake = asyncio.Event()
    loops = Periodic()
    loops.start(3600.0, "woken", job, wake=wake)
    await ran.wait()  # the first run, at once
    ran.clear()
    wake.set()
    wake.set()  # two ends before the run: one run serves both
    async with asyncio.timeout(STOP_WITHIN_S):
        await ran.wait()  # long before the hour's interval
    await asyncio.sleep(0.05)
    await loops.stop()
    assert len(runs) == 2, runs
    assert not wake.is_set(), "the run that served the wake cleared it"
