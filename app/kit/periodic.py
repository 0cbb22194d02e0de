"""Jobs run every interval until stopped, which stop even when a job swallowed its cancel.

Cancelling such a loop is not enough on its own: on Python 3.11 a cancel that
lands while a job awaits a library call can be swallowed (asyncio.wait_for's
race, python/cpython gh-86296; with redis-py 8.1 about a third of the cancels
that land during a command were, in a loop measured here). A loop whose cancel
was swallowed went on sleeping and running, and whoever awaited its end waited
for ever: a worker SIGTERMed right after its start hung until SIGKILL, and a
WebSocket's stream-slot refresher could outlive its stream. So each loop also
checks a stop flag, and waits on it instead of sleeping: whatever a job does
with a cancel, its loop ends once that run returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError

from app.kit import cancelling

log = logging.getLogger(__name__)


class Periodic:
    """Background loops, each failure of a job logged and never fatal to its loop."""

    def __init__(self) -> None:
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(
        self,
        interval_s: float,
        what: str,
        job: Callable[[], Awaitable[object]],
        *,
        now: bool = True,
        wake: asyncio.Event | None = None,
    ) -> None:
        """Run `job` every `interval_s` (first at once, or after one interval if not `now`),
        and also as soon as `wake` is set (it is cleared before the run it starts): work that
        something else knows is due need not wait for the next interval."""
        loop = self._every(interval_s, what, job, now=now, wake=wake)
        self._tasks.append(asyncio.create_task(loop, name=what))

    async def stop(self) -> None:
        """End every loop: the run in flight is cancelled, and none starts after it."""
        self._stopping.set()
        await cancelling.stop(self._tasks)

    async def _every(
        self,
        interval_s: float,
        what: str,
        job: Callable[[], Awaitable[object]],
        *,
        now: bool,
        wake: asyncio.Event | None,
    ) -> None:
        if not now:
            await self._pause(interval_s, wake)
        while not self._stopping.is_set():
            if wake is not None:
                wake.clear()  # what sets it from here on gets a run of its own
            await quietly(what, job())
            await self._pause(interval_s, wake)

    async def _pause(self, interval_s: float, wake: asyncio.Event | None) -> None:
        waits = [asyncio.ensure_future(self._stopping.wait())]
        if wake is not None:
            waits.append(asyncio.ensure_future(wake.wait()))
        try:
            await asyncio.wait(waits, timeout=interval_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()


async def quietly(what: str, job: Awaitable[object]) -> None:
    """Await a background job; an outage or a bug is logged, and the caller goes on."""
    try:
        await job
    except (RedisError, OSError) as exc:  # an outage: the next round retries
        log.warning("background job %r failed: %r", what, exc)
    except Exception:  # a background job must never take its process down
        log.exception("background job %r failed", what)
