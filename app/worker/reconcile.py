"""Reconciliation: Postgres is the truth, so whatever it says must run is on the Redis queue.

Run by every worker at start and every `worker_reconcile_interval_s`. A queued
task with no message (the API died between commit and enqueue, or Redis lost
its data) is enqueued again. So is a running task whose lease has been missing
for a whole lease period (its worker died and Redis lost the message too); the
wait lets live workers re-take leases that a Redis restart dropped. Enqueueing
twice is harmless: a worker acks a message whose task another holds or ended.

A queued task whose image is no longer in the catalogue would wait forever (no worker
reads its stream): it fails `sandbox_error`, `image_unavailable: ...`
(`services.image_failures`). So does a running one whose worker died: its message stays
pending on that stream, which no worker reclaims from. Only the attempt seen unleased for a
whole lease period, and only while still no lease is held (both checked again under the
row's lock): a worker whose catalogue still lists the image (a rollout) may have taken the
message back and started the next attempt meanwhile. Never while the catalogue file is
unreadable: a typo in the file must not fail every task of every other image.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from app.bus import keys, leases, queue
from app.domain.image_catalogue import DEFAULT as DEFAULT_IMAGE
from app.domain.image_catalogue import CatalogueError, catalogue
from app.ids import utc_now
from app.services.images import task_images
from app.services.tasks import attempts, image_failures
from app.states import TaskStatus
from app.worker.context import WorkerContext

log = logging.getLogger(__name__)
SETTLE_S = 5.0
"""Tasks younger than this are left alone: their API request may still be enqueueing them."""


class Reconciler:
    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.unleased_since: dict[tuple[str, int], float] = {}
        """(task id, attempt) -> when first seen running without a lease."""

    async def run_once(self) -> list[str]:
        """Enqueue what Postgres says must run but Redis does not have; the ids enqueued."""
        ctx = self.ctx
        tasks = await attempts.unfinished_tasks(
            ctx.sessions, utc_now() - timedelta(seconds=SETTLE_S)
        )
        if not tasks:
            self.unleased_since.clear()
            return []
        known = self._catalogue_streams()
        on_queue = await queue.queued_task_ids(ctx.redis, known or ())
        running = [task_id for task_id, status in tasks.items() if status == TaskStatus.running]
        leased = await leases.held(ctx.redis, running)
        states = await attempts.task_states(ctx.sessions, set(running) - leased)
        unleased = {
            (task_id, attempt)
            for task_id, (status, attempt) in states.items()
            if status == TaskStatus.running
        }
        lost = self._unleased_for_a_lease(unleased)
        missing = [
            task_id
            for task_id, status in tasks.items()
            if task_id not in on_queue and (status == TaskStatus.queued or task_id in lost)
        ]
        images = await task_images.images_of(ctx.sessions, missing)
        for task_id in missing:  # each on its image's stream (a deleted task: default's)
            await queue.enqueue(ctx.redis, task_id, images.get(task_id, DEFAULT_IMAGE))
        if missing:
            log.warning("reconciliation enqueued %d tasks: %s", len(missing), missing[:10])
        if known is not None:
            await self._fail_removed_images(known, lost)
        return missing

    def _catalogue_streams(self) -> list[str] | None:
        """The streams of the catalogue's images; None while the file cannot be read."""
        try:
            return queue.streams_of(catalogue(self.ctx.settings))
        except CatalogueError as exc:
            log.warning("reconciliation reads no catalogue: %s", exc)
            return None

    async def _fail_removed_images(self, known: list[str], lost: dict[str, int]) -> None:
        """Fail the queued tasks, and the `lost` running ones (a dead worker's), on the
        streams of images the catalogue no longer has."""
        ctx = self.ctx
        for stream in await queue.all_streams(ctx.redis, known):
            if stream in known:
                continue
            messages = await queue.messages_of(ctx.redis, stream)
            image = keys.image_of(stream)
            failed = set(
                await image_failures.fail_unavailable(
                    ctx.sessions, ctx.redis, set(messages.values()), image, lost=lost
                )
            )
            ended = [message for message, task_id in messages.items() if task_id in failed]
            await queue.drop(ctx.redis, stream, ended)

    def _unleased_for_a_lease(self, unleased: set[tuple[str, int]]) -> dict[str, int]:
        """Of these running (task, attempt)s without a lease, those seen so for a whole lease
        period: task id -> attempt. A new attempt starts the wait again."""
        now = time.monotonic()
        for seen in list(self.unleased_since):
            if seen not in unleased:
                del self.unleased_since[seen]
        since = {seen: self.unleased_since.setdefault(seen, now) for seen in unleased}
        lease = self.ctx.settings.worker_lease_s
        return {task: attempt for (task, attempt), first in since.items() if now - first >= lease}
