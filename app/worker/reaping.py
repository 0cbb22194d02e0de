"""The reaper job: remove this deployment's sandboxes that no live attempt can still use.

Run by every worker at start and every `worker_reap_interval_s`. A sandbox
goes when its task is finished or unknown, when a newer attempt of its task
started, or when its worker is gone (a warm-pool sandbox or a python scorer's,
which have no task, only then); then so do this deployment's volumes that no container uses any
more (a workdir whose container was removed without it). "Gone" is checked
twice, a heartbeat period apart, so a Redis that just lost every heartbeat key
(a restart without persistence) does not make live workers look dead.
Containers without our labels are never listed (`app.sandbox.reaper`), so
never touched.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

from app.bus import leases
from app.errors import SandboxError
from app.sandbox import reaper
from app.sandbox.pool import pool_labels
from app.sandbox.reaper import Labelled
from app.services.tasks import attempts
from app.states import TaskStatus, is_terminal
from app.worker.context import WorkerContext

log = logging.getLogger(__name__)


async def reap(ctx: WorkerContext, mine: Collection[str]) -> list[str]:
    """Remove doomed sandboxes, then orphaned volumes; `mine` are the tasks this worker runs
    now. The container ids removed."""
    removed = await _reap_containers(ctx, mine)
    volumes = await reaper.remove_orphan_volumes(ctx.docker, ctx.instance)
    if volumes:
        log.info("reaped %d orphaned sandbox volumes: %s", len(volumes), [v[:12] for v in volumes])
    return removed


async def _reap_containers(ctx: WorkerContext, mine: Collection[str]) -> list[str]:
    found = [
        c for c in await reaper.list_managed(ctx.docker, ctx.instance) if c.task_id not in mine
    ]
    if not found:
        return []
    tasked = [c for c in found if not _taskless(c)]
    states = await attempts.task_states(ctx.sessions, {c.task_id for c in tasked})
    finished = [c for c in tasked if _is_over(c, states.get(c.task_id))]
    removed = await reaper.remove_all(ctx.docker, finished)
    orphans = await _without_live_worker(ctx, [c for c in found if c not in finished])
    if orphans:
        await asyncio.sleep(ctx.settings.worker_heartbeat_s * leases.CONFIRM_FACTOR)
        orphans = await _without_live_worker(ctx, orphans)
        removed += await reaper.remove_all(ctx.docker, orphans)
    if removed:
        log.info("reaped %d sandboxes: %s", len(removed), [r[:12] for r in removed])
    return removed


async def remove_own_pool(ctx: WorkerContext) -> list[str]:
    """At start, before this process pools anything: the warm sandboxes a predecessor under
    this worker's name left (idle, or claimed by an attempt it lost). The reaper leaves a
    name's pool to that name while it lives, so nothing else would ever remove them."""
    labels = pool_labels(ctx.instance, ctx.name)
    removed = []
    for container in await ctx.docker.list_sandboxes(labels):
        try:
            await ctx.docker.remove_container(container)
            removed.append(container)
        except SandboxError as exc:  # gone meanwhile, or the daemon busy: its deadline's then
            log.warning("could not remove warm sandbox %s: %r", container[:12], exc)
    if removed:
        log.info("removed %d warm sandboxes a predecessor left", len(removed))
    return removed


def _taskless(container: Labelled) -> bool:
    """A warm-pool sandbox, or a `python` scorer's (`app.sandbox.python_scorer.score`): no task,
    so only its worker's death dooms it (a scorer's left between create and start, whose
    deadline never began)."""
    return container.pooled or not container.task_id


def _is_over(container: Labelled, state: tuple[str, int] | None) -> bool:
    """Its task is unknown or finished, or a newer attempt of it has started."""
    if state is None:
        return True
    status, attempt = state
    return is_terminal(TaskStatus(status)) or container.attempt < attempt


async def _without_live_worker(ctx: WorkerContext, candidates: list[Labelled]) -> list[Labelled]:
    """The candidates whose worker has no heartbeat (this worker's own are not candidates)."""
    workers = {c.worker for c in candidates if c.worker != ctx.name}
    alive = await leases.alive(ctx.redis, workers)
    return [c for c in candidates if c.worker in workers and c.worker not in alive]
