"""Ending queued tasks whose image left the catalogue: they would otherwise wait forever.

A task names its image at submit; if the operator then removes that image from the
catalogue file, no worker will ever read its stream. Reconciliation (the worker's)
calls here for the messages on such streams: each task still `queued` fails with
`sandbox_error` and an error starting `image_unavailable:` (no new finish reason, so
the contract's list stays as it is), and its message is dropped. So does a `running`
one whose worker died (its lease gone for a whole lease period): no worker reads that
stream, so none would ever reclaim its message and start the next attempt. Only the attempt
reconciliation saw lost, and only while no lease is held, both checked under the row's lock
(a worker that still reads the stream during a rollout may have started the next one).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from redis.asyncio import Redis

from app.bus import cancel, leases
from app.db.engine import Sessions
from app.errors import NotFound
from app.services.tasks.lifecycle import TaskEnd, finish_row, lock_task, publish_quietly
from app.states import FinishReason, TaskStatus

log = logging.getLogger(__name__)
ERROR_CODE = "image_unavailable"


def unavailable_error(image: str) -> str:
    """The `error` of such a task: the code first, then what to do."""
    return (
        f"{ERROR_CODE}: image {image!r} is no longer in the image catalogue"
        " (SANDHIVE_SANDBOX_IMAGES_FILE); submit the task again with an image it lists"
    )


async def fail_unavailable(
    sessions: Sessions,
    redis: Redis,
    task_ids: Collection[str],
    image: str,
    *,
    lost: Mapping[str, int] | None = None,
) -> list[str]:
    """Fail each of these tasks that is still queued, or running the attempt `lost` names (a
    dead worker's: task id -> attempt) with no lease held; the ids failed (another running
    one, an ended one or an unknown id is left alone: its own attempt or nobody owns it)."""
    lost = lost or {}
    failed: list[str] = []
    for task_id in task_ids:
        async with sessions.begin() as session:
            try:
                task = await lock_task(session, task_id)
            except NotFound:
                continue
            was_running = task.status == TaskStatus.running and lost.get(task_id) == task.attempt
            if was_running and await leases.held(redis, [task_id]):
                continue  # taken again since: a start holds the lease before this row's lock
            if task.status != TaskStatus.queued and not was_running:
                continue
            end = TaskEnd(FinishReason.sandbox_error, error=unavailable_error(image))
            events = await finish_row(session, task, end)
        await publish_quietly(redis, events)
        if was_running:  # should its worker be alive after all: stop at its next write
            await cancel.raise_flag(redis, task_id)
        failed.append(task_id)
    if failed:
        log.warning("failed %d tasks of image %s (not in the catalogue)", len(failed), image)
    return failed
