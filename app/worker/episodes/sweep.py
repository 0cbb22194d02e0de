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

Submitted answers of a deferred scorer (`llm_judge`, `python`) with no reward and no
scoring lease (`app.bus.episodes.scoring`, checked twice as heartbeats are) get the
infrastructure error as their reward: their worker died (or could not store it) before it
scored, and nobody else ever will. `end_own` stores it at once for its own (its
predecessor's lease may not have lapsed yet, but it scores nothing any more).

Ending goes through `services.episodes.end`, which changes only an active row: an
episode the API or its worker ended meanwhile keeps that end.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from app.bus import episodes as bus
from app.bus import leases
from app.ids import utc_now
from app.services.episodes import reward as episodes_reward
from app.services.episodes import service as episodes
from app.services.episodes import sweep as episodes_sweep
from app.worker.context import WorkerContext

log = logging.getLogger(__name__)
SETTLE_S = 30.0
"""Past the open timeout, how long an unclaimed episode is left to its API request."""


async def sweep(ctx: WorkerContext) -> list[str]:
    """End the active episodes nobody alive holds; the ids ended by this run."""
    ended = await _orphans(ctx) + await _unclaimed(ctx)
    if ended:
        log.warning("episode sweep ended %d episodes: %s", len(ended), ended[:10])
    lost = await _unscored(ctx)
    if lost:
        log.warning("episode sweep: %d rewards nobody scores: %s", len(lost), lost[:10])
    return ended + lost


async def end_own(ctx: WorkerContext) -> list[str]:
    """At start, before it opens any: the episodes the rows say this worker holds."""
    ended = []
    for episode_id in await episodes.open_on(ctx.sessions, ctx.name):
        if await _end(ctx, episode_id, f"its worker {ctx.name} restarted"):
            ended.append(episode_id)
    unscored = await episodes_sweep.unscored(ctx.sessions, ctx.name)
    for episode_id, kind in unscored.items():
        why = f"its worker {ctx.name} restarted before it scored (found at its start)"
        if await episodes_reward.store_lost(ctx.sessions, episode_id, kind, why):
            ended.append(episode_id)
    if ended:
        log.warning("ended %d episodes of this worker's previous run: %s", len(ended), ended[:10])
    return ended


async def _orphans(ctx: WorkerContext) -> list[str]:
    by_worker = await episodes_sweep.open_by_worker(ctx.sessions)
    dead = await leases.missing_twice(
        lambda workers: leases.alive(ctx.redis, workers), by_worker, ctx.settings.worker_heartbeat_s
    )
    ended = []
    for worker in sorted(dead):
        for episode_id in by_worker[worker]:
            if await _end(ctx, episode_id, f"its worker {worker} is gone"):
                ended.append(episode_id)
    return ended


async def _unscored(ctx: WorkerContext) -> list[str]:
    """Store the infrastructure error as the reward nobody will score (no lease, twice)."""
    unscored = await episodes_sweep.unscored(ctx.sessions)
    lost = await leases.missing_twice(
        lambda ids: bus.scoring(ctx.redis, ids), unscored, ctx.settings.worker_heartbeat_s
    )
    stored = []
    for episode_id in sorted(lost):
        why = "its worker was lost before it scored (found by the episode sweep)"
        if await episodes_reward.store_lost(ctx.sessions, episode_id, unscored[episode_id], why):
            stored.append(episode_id)
    return stored


async def _unclaimed(ctx: WorkerContext) -> list[str]:
    now, s = utc_now(), ctx.settings
    before = now - timedelta(seconds=s.episode_open_timeout_s + SETTLE_S)
    forks_before = now - timedelta(seconds=s.fork_timeout_s + SETTLE_S)
    ended = []
    for episode_id in await episodes_sweep.unclaimed_since(ctx.sessions, before, forks_before):
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
