"""Which worker a new sandbox (or a tenant's image build) goes to, and whether it still lives.

Every later request of a sandbox goes to the worker its row names; only a creation or a
build chooses, and both want the same: a live worker with the base image and sandbox slots,
not drained, holding the fewest sandboxes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from app.bus import keys
from app.db.engine import Sessions
from app.domain.image_catalogue import DEFAULT as DEFAULT_IMAGE
from app.services.admin import service as admin
from app.services.sandboxes import service as rows


async def candidates(sessions: Sessions, redis: Redis, *images: str) -> list[str]:
    """Live workers that have every one of the catalogue images and sandbox slots and are
    not drained, least busy first (every worker runs `default`, as for tasks and episodes,
    whatever its heartbeat lists yet)."""
    wanted = set(images) - {DEFAULT_IMAGE}
    load = await rows.load_per_worker(sessions)
    workers = [
        worker.name
        for worker in await admin.list_workers(redis)
        if not worker.draining and worker.sandbox_slots != 0 and wanted <= set(worker.images)
    ]
    return sorted(workers, key=lambda name: (load.get(name, 0), name))


def worker_alive(redis: Redis, worker: str) -> Callable[[], Awaitable[bool]]:
    """A check `app.bus.files.wait_reply` calls: whether the worker's heartbeat is there."""

    async def alive() -> bool:
        return bool(await redis.exists(keys.worker_heartbeat(worker)))

    return alive
