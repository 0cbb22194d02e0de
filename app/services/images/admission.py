"""Refusing a task whose image no live worker has, when the operator asks for it.

Off by default (`SANDHIVE_REFUSE_TASKS_WITHOUT_IMAGE_WORKER`): such a task is accepted
and waits on its image's stream until a worker with the image starts, which is what a
deployment that starts workers on demand wants. On, a submission (or a batch) naming
such an image is answered 503 `no_worker_for_image` before anything is stored. `default`
is never refused: every worker of the catalogue release reads it.
"""

from __future__ import annotations

from collections.abc import Iterable

from redis.asyncio import Redis

from app.bus import leases
from app.config import Settings
from app.domain.image_catalogue import DEFAULT
from app.errors import NoWorkerForImage


async def check_image_workers(redis: Redis, settings: Settings, images: Iterable[str]) -> None:
    """NoWorkerForImage for the first of `images` no live worker has (when refusing is on)."""
    wanted = sorted(set(images) - {DEFAULT})
    if not settings.refuse_tasks_without_image_worker or not wanted:
        return
    here = await leases.live_images(redis)
    for image in wanted:
        if image not in here:
            raise NoWorkerForImage(
                f"no live worker has the image {image!r} (sandhive image build {image})",
                settings.unavailable_retry_after_s,
                details={"image": image},
            )
