"""Ending queued tasks whose image left the catalogue: they would otherwise wait forever.

A task names its image at submit; if the operator then removes that image from the
catalogue file, no worker will ever read its stream. Reconciliation (the worker's)
calls here for the messages on such streams: each task still `queued` fails with
`sandbox_error` and an error starting `image_unavailable:` (no new finish reason, so
the contract's list stays as it is), and its message is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from redis.asyncio import Redis

from app.db.engine import Sessions
from app.errors import NotFound
from app.services.lifecycle import TaskEnd, finish_row, lock_task, publish_quietly
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
    sessions: Sessions, redis: Redis, task_ids: Collection[str], image: str
) -> list[str]:
    """Fail each of these tasks that is still queued; the ids failed (a running or ended
    one, or an unknown id, is left alone: its own attempt or nobody owns it)."""
    failed: list[str] = []
    for task_id in task_ids:
        async with sessions.begin() as session:
            try:
                task = await lock_task(session, task_id)
            except NotFound:
                continue
            if task.status != TaskStatus.queued:
                continue
            end = TaskEnd(FinishReason.sandbox_error, error=unavailable_error(image))
            events = await finish_row(session, task, end)
        await publish_quietly(redis, events)
        failed.append(task_id)
    if failed:
        log.warning("failed %d queued tasks of image %s (not in the catalogue)", len(failed), image)
    return failed
