"""The API's side of an episode's requests: open, step, close over `app.bus.episodes`.

Whatever keeps an answer from coming (no worker took the episode, its worker died,
no answer in time) ends the episode with an infrastructure error before the 503, so
the row never says `open` for a sandbox nobody holds.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from redis.asyncio import Redis

from app.bus import episodes as bus
from app.bus import leases, presence
from app.catalogue import DEFAULT as DEFAULT_IMAGE
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.episode_schemas import EpisodeCreate, EpisodeOpened, EpisodeStepOut
from app.errors import Conflict, InvalidInput, Unavailable
from app.services import admin
from app.services import episodes as rows
from app.services.episodes_holders import HOLDERS
from app.services.task_images import image_name

log = logging.getLogger(__name__)
RETRY_S = 5


async def open_episode(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, body: EpisodeCreate
) -> EpisodeOpened:
    row = rows.new_row(settings, tenant, body)
    if not await presence.any_worker(redis):  # else the caller would wait out the timeout
        raise Unavailable(
            "no worker is running to open the episode (start one: sandhive worker)",
            RETRY_S,
            details={"error_kind": "infrastructure"},
        )
    image = image_name(row.spec["task"])
    if image != DEFAULT_IMAGE and not await _some_worker_has(redis, image):
        raise Unavailable(
            f"no live worker has the image {image!r} (sandhive image build {image})",
            RETRY_S,
            details={"error_kind": "infrastructure"},
        )
    await rows.store(sessions, settings, row)
    ttl_s = settings.episode_open_timeout_s
    reply_key = await bus.request_open(redis, row.id, image, ttl_s=ttl_s)
    reply = await bus.wait_reply(redis, reply_key, timeout_s=settings.episode_open_timeout_s)
    if reply is None:
        await _lost(sessions, redis, row.id, "no worker opened the episode in time")
    elif "failure" in reply:
        raise Unavailable(f"the episode could not be opened: {reply['failure']}", RETRY_S)
    elif reply["done"]:  # the sandbox never became ready: the worker ended the episode
        raise Unavailable(
            f"episode {row.id} could not start: {reply.get('error')}",
            RETRY_S,
            details={
                "error_kind": reply.get("error_kind"),
                "finish_reason": reply["finish_reason"],
            },
        )
    fresh = await rows.find(sessions, tenant, row.id)
    assert reply is not None
    return EpisodeOpened(
        **rows.out(fresh).model_dump(), messages=reply["messages"], tools=reply["tools"]
    )


async def _some_worker_has(redis: Redis, image: str) -> bool:
    """Whether a live worker's heartbeat says its daemon has the image (a task would wait
    for one; a trainer waiting on an open would only time out)."""
    return any(image in worker.images for worker in await admin.list_workers(redis))


async def step(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    tenant: str,
    episode_id: str,
    message: dict[str, Any],
) -> EpisodeStepOut:
    started = time.monotonic()
    row = await HOLDERS.find(sessions, tenant, episode_id)  # no read while known open
    worker = _holder(row)
    try:
        reply = await _call(
            sessions,
            redis,
            row,
            worker,
            {"op": "step", "episode_id": row.id, "message": message},
            settings.episode_step_timeout_s,
        )
    except (Conflict, Unavailable):
        HOLDERS.forget(episode_id)
        raise
    if "invalid" in reply:
        raise InvalidInput(str(reply["invalid"]))
    if "conflict" in reply or reply["done"]:
        HOLDERS.forget(episode_id)
    if "conflict" in reply:
        raise Conflict(str(reply["conflict"]))
    return EpisodeStepOut(
        messages=reply["messages"],
        done=reply["done"],
        finish_reason=reply.get("finish_reason"),
        error=reply.get("error"),
        error_kind=reply.get("error_kind"),
        timings={**reply["timings"], "api_ms": int((time.monotonic() - started) * 1000)},
    )


async def close(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, episode_id: str
) -> models.EpisodeRow:
    """Close it and remove its sandbox; closing an ended episode only marks it closed."""
    row = await rows.find(sessions, tenant, episode_id)  # 404 first: another's stays cached
    HOLDERS.forget(episode_id)
    if row.status == "open" and row.worker is not None:
        request = {"op": "close", "episode_id": row.id}
        try:
            await _call(sessions, redis, row, row.worker, request, settings.episode_step_timeout_s)
        except (Conflict, Unavailable):  # it ended meanwhile, or its worker is gone: ended now
            pass
    elif row.status == "opening":
        await rows.end(sessions, row.id, status="closed", finish_reason="closed")
    await rows.close_done(sessions, row.id)
    return await rows.find(sessions, tenant, episode_id)


def _holder(row: models.EpisodeRow) -> str:
    if row.status != "open" or row.worker is None:
        raise Conflict(
            f"the episode is {row.status} ({row.finish_reason}); no more steps",
            details={"status": row.status, "finish_reason": row.finish_reason},
        )
    return row.worker


async def _call(
    sessions: Sessions,
    redis: Redis,
    row: models.EpisodeRow,
    worker: str,
    request: dict[str, Any],
    timeout_s: float,
) -> dict[str, Any]:
    async def alive() -> bool:
        return bool(await leases.alive(redis, [worker]))

    reply_key = await bus.send_to_live(redis, worker, request)
    if reply_key is None:
        await _lost(sessions, redis, row.id, f"its worker {worker} is gone")
    assert reply_key is not None
    reply = await bus.wait_reply(redis, reply_key, timeout_s=timeout_s, alive=alive)
    if reply is None:
        if request["op"] != "close":  # it may still be alive, only stuck: free the sandbox
            await bus.send(redis, worker, {"op": "close", "episode_id": row.id})
        await _lost(sessions, redis, row.id, f"no answer from its worker {worker}")
    assert reply is not None
    if reply.get("failure") == "unknown episode":
        # The worker no longer holds it: it ended there (the row says how) or was lost.
        fresh = await rows.find(sessions, row.tenant_id, row.id)
        if fresh.status in rows.ACTIVE:
            await _lost(sessions, redis, row.id, f"its worker {worker} no longer holds it")
        raise Conflict(f"the episode is {fresh.status} ({fresh.finish_reason}); no more steps")
    if "failure" in reply:
        raise Unavailable(str(reply["failure"]), RETRY_S)
    return reply


async def _lost(sessions: Sessions, redis: Redis, episode_id: str, why: str) -> None:
    """End the episode as an infrastructure failure and answer 503."""
    await rows.end(
        sessions,
        episode_id,
        status="done",
        finish_reason="worker_lost",
        error=f"infrastructure: {why}",
        error_kind=rows.INFRASTRUCTURE,
    )
    log.warning("episode %s ended: %s", episode_id, why)
    raise Unavailable(
        f"episode {episode_id} ended: {why} (an infrastructure failure)",
        RETRY_S,
        details={
            "episode_id": episode_id,
            "error_kind": rows.INFRASTRUCTURE,
            "finish_reason": "worker_lost",
        },
    )


__all__ = ["close", "open_episode", "step"]
