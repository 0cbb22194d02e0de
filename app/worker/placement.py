"""Whether a task just taken belongs on this host: its image must be here.

A worker reads only the streams of the images its daemon has, but the default stream
can still carry a task of another image: a worker of the release before the catalogue
(whose reconciliation and requeues know only the default stream) put it there during
a rolling upgrade. Such a task is moved, in one Redis script, to its image's stream
and this message acked: never lost (the XADD comes first), never run twice (the lease
is held until then), never started where `docker run` would say "no such image".
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from redis.asyncio import Redis

from app.bus import keys, leases
from app.db.engine import Sessions
from app.domain.image_catalogue import DEFAULT
from app.services.images import task_images
from app.worker.taking import Taken

log = logging.getLogger(__name__)


async def foreign_image(sessions: Sessions, taken: Taken, present: Collection[str]) -> str | None:
    """The task's image when this worker lacks it; None when it may start here.

    Only the default stream is checked (one primary-key read): a message on an image's
    own stream was read because that image is here.
    """
    if taken.claim.stream != keys.TASK_STREAM:
        return None
    image = (await task_images.images_of(sessions, [taken.task_id])).get(taken.task_id, DEFAULT)
    return None if image in present else image


async def send_to_image(redis: Redis, taken: Taken, image: str) -> None:
    """Put the task on its image's stream and ack this message, dropping the lease."""
    claim = taken.claim
    log.warning(
        "task %s (image %s) was on the default stream: moved to its image's", taken.task_id, image
    )
    await leases.release(
        redis,
        taken.task_id,
        taken.holder,
        claim.message_id,
        requeue=True,
        stream=claim.stream,
        requeue_on=keys.task_stream(image),
    )
