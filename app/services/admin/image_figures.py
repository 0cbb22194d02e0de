"""Per-image queue figures for `/metrics`: what waits for each image and who could run it.

A task whose image no live worker has waits on its stream (`app.bus.queue`) without an
error; these figures make that visible: the waiting count, the oldest waiting
message's age and the live workers whose heartbeat lists the image, per image of the
catalogue and per stream ever written (an image removed from the file still shows).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from app.bus import keys, queue
from app.config import Settings
from app.domain.image_catalogue import CatalogueError, catalogue
from app.services.admin.service import WorkerInfo


@dataclass(frozen=True)
class ImageQueue:
    image: str
    waiting: int
    """Messages no worker has read yet."""
    oldest_age_s: float
    """Age of the oldest of those (0 when none waits)."""
    workers: int
    """Live workers whose daemon has the image."""


def catalogue_streams(settings: Settings) -> list[str]:
    """The streams of the catalogue's images; none but default's when the file is broken."""
    try:
        return queue.streams_of(catalogue(settings))
    except CatalogueError:
        return [keys.TASK_STREAM]


async def image_queues(
    redis: Redis, settings: Settings, workers: Sequence[WorkerInfo]
) -> list[ImageQueue]:
    """One row per image, by name."""
    streams = await queue.all_streams(redis, catalogue_streams(settings))
    now_ms = time.time() * 1000
    rows = []
    for backlog in await queue.backlogs(redis, streams):
        image = keys.image_of(backlog.stream)
        age = 0.0 if backlog.oldest_ms is None else max(now_ms - backlog.oldest_ms, 0) / 1000
        having = sum(1 for worker in workers if image in worker.images)
        rows.append(ImageQueue(image, backlog.waiting, age, having))
    return sorted(rows, key=lambda row: row.image)
