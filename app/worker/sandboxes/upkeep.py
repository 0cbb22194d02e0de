"""Deadlines and clean-up of `/v1/sandboxes` sandboxes.

Every second a worker reads the rows of the sandboxes it holds, in one query: the row is the
truth. One that ended elsewhere (deleted through an API whose call to this worker was lost, or
declared lost) has its container removed; one whose `expires_at` passed is ended `expired` by
an update that checks the deadline on Postgres's clock (an extension that came first wins),
then removed; one nearing it gets `sandbox.expiring`, once per deadline.

Once, at start (`end_own`), a worker ends the sandboxes the rows say it holds (a predecessor
under the same name held them) and removes their containers; every reap interval
(`sweep`), any worker ends the running sandboxes of workers gone (twice a heartbeat apart)
and `starting` ones nobody will start any more; the reaper removes their containers.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any, Protocol

from app.bus import leases
from app.errors import SandboxError
from app.ids import utc_now
from app.sandbox.policy import SANDBOX_LABEL
from app.sandbox.reaper import INSTANCE_LABEL, WORKER_LABEL
from app.services.sandboxes import service as rows
from app.worker.context import WorkerContext

log = logging.getLogger(__name__)
SETTLE_S = 30.0
"""Past the create timeout, how long a `starting` sandbox is left to its API request."""


class Holder(Protocol):
    """What `tick` needs of `app.worker.sandboxes.server.SandboxServer`."""

    ctx: WorkerContext

    @property
    def live(self) -> dict[str, Any]: ...

    async def remove(self, held: Any, reason: str, error: str | None) -> None: ...

    async def forget(self, held: Any) -> None: ...


async def tick(server: Holder) -> None:
    ctx, live = server.ctx, server.live
    if not live:
        return
    # The sandboxes held *before* the query: one created while it ran has no state in it,
    # and must not be taken for one that ended elsewhere (its container was removed).
    held_then = dict(live)
    states = await rows.states(ctx.sessions, list(held_then))
    now = time.time()
    lead = ctx.settings.webhook_expiring_lead_s
    for sandbox_id, held in held_then.items():
        still_held = sandbox_id in live and live[sandbox_id] is held
        if not still_held:
            continue  # removed meanwhile (deleted)
        state = states.get(sandbox_id)
        if state is None or state[0] != "running":
            await server.forget(held)  # ended elsewhere: only the container is left
            continue
        held.expires_at = state[1].timestamp()
        if held.expires_at <= now:
            if await rows.expire(ctx.sessions, sandbox_id):
                await server.forget(held)
        elif held.expires_at - lead <= now and held.announced != held.expires_at:
            if await rows.announce_expiring(ctx.sessions, sandbox_id, held.expires_at):
                held.announced = held.expires_at


async def end_own(ctx: WorkerContext) -> list[str]:
    """At start: the sandboxes the rows say this worker holds are lost (a predecessor under
    the same name held them); their containers go now."""
    ended = []
    for sandbox_id in await rows.active_on(ctx.sessions, ctx.name):
        why = "infrastructure: its worker restarted"
        if await rows.end(ctx.sessions, sandbox_id, "worker_lost", why):
            ended.append(sandbox_id)
    labels = {INSTANCE_LABEL: ctx.instance, WORKER_LABEL: ctx.name}
    for container in await ctx.docker.list_sandboxes(labels, with_label=SANDBOX_LABEL):
        try:
            await ctx.docker.remove_container(container)
        except SandboxError as exc:  # gone meanwhile, or the daemon busy: the reaper's then
            log.warning("could not remove sandbox container %s: %r", container[:12], exc)
    return ended


async def sweep(ctx: WorkerContext) -> list[str]:
    """End the running sandboxes whose worker is gone, and `starting` ones nobody will
    start any more; the ids ended."""
    by_worker = await rows.active_by_worker(ctx.sessions)
    dead = await leases.missing_twice(
        lambda workers: leases.alive(ctx.redis, workers), by_worker, ctx.settings.worker_heartbeat_s
    )
    ended = []
    for worker in sorted(dead):
        for sandbox_id in by_worker[worker]:
            why = f"infrastructure: its worker {worker} is gone"
            if await rows.end(ctx.sessions, sandbox_id, "worker_lost", why):
                ended.append(sandbox_id)
    wait = timedelta(seconds=ctx.settings.sandbox_create_timeout_s + SETTLE_S)
    for sandbox_id in await rows.starting_before(ctx.sessions, utc_now() - wait):
        if await rows.end(ctx.sessions, sandbox_id, "failed", "no worker started it"):
            ended.append(sandbox_id)
    if ended:
        log.warning("sandbox sweep ended %d sandboxes: %s", len(ended), ended[:10])
    return ended
