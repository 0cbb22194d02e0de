"""The episode sweep: end the episodes Postgres says are active that no live worker holds.

Run by every worker at start and every `worker_reap_interval_s`, beside the reaper
(which removes such an episode's sandbox: its worker is gone). Two kinds are ended,
with `worker_lost` and an infrastructure error, so a trainer masks them out of its loss
and the tenant's cap is freed even if nobody calls the episode again:

* `open` episodes whose worker has no heartbeat, checked twice a heartbeat period
  apart as the reaper does (a Redis that just lost every heartbeat key, a restart
  without persistence, must not end live workers' episodes);
* `opening` episodes older than the open timeout plus `SETTLE_S`: no worker ever took
  them, and the API that waited for one (and ends them itself when it gives up) died.

A worker also ends, once at its start, the episodes the rows say it holds (`end_own`):
a worker restarted under the same name holds none of its predecessor's.

Ending goes through `services.episodes.end`, which changes only an active row: an
episode the API or its worker ended meanwhile keeps that end.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from app.bus import leases
from app.ids import utc_now
from app.services import episodes, episodes_sweep
from app.worker.context import WorkerContext
from app.worker.reaping import CONFIRM_FACTOR

log = logging.getLogger(__name__)
SETTLE_S = 30.0
"""Past the open timeout, how long an unclaimed episode is left to its API request."""


async def sweep(ctx: WorkerContext) -> list[str]:
    """End the active episodes nobody alive holds; the ids ended by this run."""
    ended = await _orphans(ctx) + await _unclaimed(ctx)
    if ended:
        log.warning("episode sweep ended %d episodes: %s", len(ended), ended[:10])
    return ended


async def end_own(ctx: WorkerContext) -> list[str]:
    """At start, before it opens any: the episodes the rows say this worker holds."""
    ended = []
    for episode_id in await episodes.open_on(ctx.sessions, ctx.name):
        if await _end(ctx, episode_id, f"its worker {ctx.name} restarted"):
            ended.append(episode_id)
    if ended:
        log.warning("ended %d episodes of this worker's previous run: %s", len(ended), ended[:10])
    return ended


async def _orphans(ctx: WorkerContext) -> list[str]:
    by_worker = await episodes_sweep.open_by_worker(ctx.sessions)
    dead = set(by_worker) - await leases.alive(ctx.redis, by_worker)
    if not dead:
        return []
    await asyncio.sleep(ctx.settings.worker_heartbeat_s * CONFIRM_FACTOR)
    dead -= await leases.alive(ctx.redis, dead)
    ended = []
    for worker in sorted(dead):
        for episode_id in by_worker[worker]:
            if await _end(ctx, episode_id, f"its worker {worker} is gone"):
                ended.append(episode_id)
    return ended


async def _unclaimed(ctx: WorkerContext) -> list[str]:
    wait = timedelta(seconds=ctx.settings.episode_open_timeout_s + SETTLE_S)
    ended = []
    for episode_id in await episodes_sweep.unclaimed_since(ctx.sessions, utc_now() - wait):
        if await _end(ctx, episode_id, "no worker ever opened it"):
            ended.append(episode_id)
    return ended


async def _end(ctx: WorkerContext, episode_id: str, why: str) -> bool:
    return await episodes.end(
        ctx.sessions,
        episode_id,
        status="done",
        finish_reason="worker_lost",
        error=f"infrastructure: {why} (found by the episode sweep)",
        error_kind=episodes.INFRASTRUCTURE,
    )
