"""Keeping a worker's promises while it runs tasks: heartbeat, lease renewal, cancel watch.

`keep_alive` runs every `worker_heartbeat_s`: it says the worker is alive,
renews the lease of each task it runs (stopping any task another worker took
over) and reads cancels recorded in Postgres (the backstop for a lost Redis
flag). `watch_cancels` polls the Redis cancel flags every `worker_cancel_poll_s`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence

from app.bus import cancel, leases
from app.services.tasks import attempts
from app.worker.context import WorkerContext
from app.worker.running import Running, StopReason


async def keep_alive(
    ctx: WorkerContext, running: Mapping[str, Running], images: Sequence[str] = ()
) -> None:
    """`images`: the catalogue images the worker's daemon has, told in the heartbeat (so
    `GET /v1/images` can say which are available on some worker)."""
    lease_ms = int(ctx.settings.worker_lease_s * 1000)
    info = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "tasks": len(running),
        "slots": ctx.settings.worker_concurrency,
        "sandbox_slots": ctx.settings.sandbox_slots,
        "images": list(images),
    }
    await leases.beat(ctx.redis, ctx.name, lease_ms, info)
    for item in list(running.values()):
        kept = await leases.renew(
            ctx.redis,
            item.task_id,
            item.holder,
            lease_ms,
            consumer=ctx.name,
            message_id=item.claim.message_id,
            stream=item.claim.stream,
        )
        if not kept:
            item.request_stop(StopReason.lease_lost)
    for task_id in await attempts.cancel_requested(ctx.sessions, list(running)):
        _stop(running, task_id, StopReason.cancel)


async def watch_cancels(ctx: WorkerContext, running: Mapping[str, Running]) -> None:
    for task_id in await cancel.flagged(ctx.redis, list(running)):
        _stop(running, task_id, StopReason.cancel)


def _stop(running: Mapping[str, Running], task_id: str, reason: StopReason) -> None:
    item = running.get(task_id)
    if item is not None:
        item.request_stop(reason)
