"""The API's side of an episode's requests: open, step, close over `app.bus.episodes`.

Whatever keeps an answer from coming (no worker took the episode, its worker died,
no answer in time) ends the episode with an infrastructure error before the 503, so
the row never says `open` for a sandbox nobody holds. When the worker had ended it first
(the loop ended, then the worker died scoring the answer, or its answer was lost), the
row's end is the answer instead: the final step's shape (`done`, its `finish_reason`),
without its messages (`_ended_meanwhile`).

A step of an episode with a deferred scorer waits `episode_step_timeout_s` like any
other; only while its worker holds the episode's scoring lease (the step was the final
one and the answer is being scored) does it wait up to `experiment_scoring_timeout_s`
longer (`_wait`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

from app.bus import episodes as bus
from app.bus import leases, presence
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.domain.image_catalogue import DEFAULT as DEFAULT_IMAGE
from app.errors import Conflict, InvalidInput, TooManyRequests, Unavailable
from app.schemas.episodes import EpisodeCreate, EpisodeOpened, EpisodeStepOut
from app.services.admin import service as admin
from app.services.episodes import retries
from app.services.episodes import service as rows
from app.services.episodes.holders import HOLDERS
from app.services.images.task_images import image_name

log = logging.getLogger(__name__)
RETRY_S = 5
FULL_RETRY_S = 2


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
    await _some_worker_has_room(redis)
    await rows.store(sessions, settings, row)
    ttl_s = settings.episode_open_timeout_s
    reply_key = await bus.request_open(redis, row.id, image, ttl_s=ttl_s)
    reply = await bus.wait_reply(redis, reply_key, timeout_s=settings.episode_open_timeout_s)
    if reply is None:
        reply = await _lost(sessions, redis, row, "no worker opened the episode in time")
    if "failure" in reply:
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


async def _some_worker_has_room(redis: Redis) -> None:
    """429 at once when every live worker said it has no episode slot free (a worker that
    said nothing, an older release, may have one: the open waits for it as before)."""
    workers = [w.name for w in await admin.list_workers(redis) if not w.draining]
    free = await bus.free_slots(redis, workers)
    if workers and len(free) == len(workers) and not any(free.values()):
        raise TooManyRequests(
            f"every worker's episode slots are taken ({len(workers)} workers,"
            " SANDHIVE_EPISODE_SLOTS each): close an episode or retry later",
            FULL_RETRY_S,
            details={"error_kind": "capacity"},
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
    idempotency_key: str | None = None,
) -> EpisodeStepOut:
    """The trainer's turn; with `idempotency_key`, run once however often it is sent
    (`app.services.episodes.retries`)."""
    if idempotency_key is None:
        return await _step(sessions, redis, settings, tenant, episode_id, message)
    await HOLDERS.find(sessions, tenant, episode_id)  # 404 before anything is claimed
    claim_s = settings.episode_step_timeout_s + settings.experiment_scoring_timeout_s + 5
    return await retries.once(
        redis,
        episode_id,
        idempotency_key,
        message,
        ttl_s=settings.episode_step_key_ttl_s,
        claim_s=claim_s,
        step=lambda: _step(sessions, redis, settings, tenant, episode_id, message),
    )


async def _step(
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
        reply = await call_worker(
            sessions,
            redis,
            row,
            worker,
            {"op": "step", "episode_id": row.id, "message": message},
            settings.episode_step_timeout_s,
            settings.experiment_scoring_timeout_s if rows.has_deferred_scorer(row) else 0.0,
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
            await call_worker(
                sessions, redis, row, row.worker, request, settings.episode_step_timeout_s
            )
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


async def call_worker(
    sessions: Sessions,
    redis: Redis,
    row: models.EpisodeRow,
    worker: str,
    request: dict[str, Any],
    timeout_s: float,
    scoring_s: float = 0.0,
    *,
    slow_is_lost: bool = True,
) -> dict[str, Any]:
    """The worker's reply; `scoring_s`: how much longer to wait while it scores.
    `slow_is_lost`: no answer in time from a live worker ends the episode (a step); False
    answers 503 and leaves it as it is (a fork, whose worker may still be starting children)."""

    async def alive() -> bool:
        return bool(await leases.alive(redis, [worker]))

    reply_key = await bus.send_to_live(redis, worker, request)
    if reply_key is None:
        return await _lost(sessions, redis, row, f"its worker {worker} is gone")
    reply = await bus.wait_reply(redis, reply_key, timeout_s=timeout_s, alive=alive)
    if reply is None and scoring_s > 0:
        reply = await _wait_scoring(redis, row.id, reply_key, scoring_s, alive)
    if reply is None and not slow_is_lost and await alive():
        raise Unavailable(f"no answer from its worker {worker} in {timeout_s:.0f} s", RETRY_S)
    if reply is None:
        # The row says lost first, then the worker (alive, only stuck) is asked to free the
        # sandbox: its close must not be taken for the episode's end (the first end stands).
        try:
            return await _lost(sessions, redis, row, f"no answer from its worker {worker}")
        finally:
            if request["op"] != "close":
                await bus.send(redis, worker, {"op": "close", "episode_id": row.id})
    if reply.get("failure") == "unknown episode":
        # The worker no longer holds it: it ended there (the row says how) or was lost.
        fresh = await rows.find(sessions, row.tenant_id, row.id)
        if fresh.status in rows.ACTIVE:
            return await _lost(sessions, redis, row, f"its worker {worker} no longer holds it")
        raise Conflict(f"the episode is {fresh.status} ({fresh.finish_reason}); no more steps")
    if "failure" in reply:
        raise Unavailable(str(reply["failure"]), RETRY_S)
    return reply


async def _wait_scoring(
    redis: Redis,
    episode_id: str,
    reply_key: str,
    extra_s: float,
    alive: Callable[[], Awaitable[bool]],
) -> dict[str, Any] | None:
    """Past the step's own timeout: wait on (up to `extra_s`) while the worker says, by the
    episode's scoring lease, that it scores the final step's answer; one slice more once
    it stops saying so (the reward is stored just before the answer is sent)."""
    deadline = time.monotonic() + extra_s
    while time.monotonic() < deadline and await bus.scoring(redis, [episode_id]):
        left = min(bus.WAIT_SLICE_S, deadline - time.monotonic())
        reply = await bus.wait_reply(redis, reply_key, timeout_s=left, alive=alive)
        if reply is not None or not await alive():
            return reply
    return await bus.wait_reply(redis, reply_key, timeout_s=bus.WAIT_SLICE_S)


async def _lost(
    sessions: Sessions, redis: Redis, row: models.EpisodeRow, why: str
) -> dict[str, Any]:
    """End the episode as an infrastructure failure and answer 503; or, when it had ended
    already (its worker ended it first), the row's end as the reply."""
    if not await rows.end(
        sessions,
        row.id,
        status="done",
        finish_reason="worker_lost",
        error=f"infrastructure: {why}",
        error_kind=rows.INFRASTRUCTURE,
    ):
        return await _ended_meanwhile(sessions, row, why)
    log.warning("episode %s ended: %s", row.id, why)
    raise Unavailable(
        f"episode {row.id} ended: {why} (an infrastructure failure)",
        RETRY_S,
        details={
            "episode_id": row.id,
            "error_kind": rows.INFRASTRUCTURE,
            "finish_reason": "worker_lost",
        },
    )


async def _ended_meanwhile(sessions: Sessions, row: models.EpisodeRow, why: str) -> dict[str, Any]:
    """A reply like a final step's from the row, which its worker ended before the answer
    was lost (typically: submitted, then the worker died while it scored; `/reward` then
    answers the real result, `pending` meanwhile): `done`, the row's `finish_reason`,
    `error` and `error_kind`, no messages (the final tool result is lost)."""
    fresh = await rows.find(sessions, row.tenant_id, row.id)
    log.warning("episode %s: %s, but it had ended (%s)", row.id, why, fresh.finish_reason)
    return {
        "done": True,
        "messages": [],
        "finish_reason": fresh.finish_reason,
        "error": fresh.error,
        "error_kind": fresh.error_kind,
        "timings": {},
    }


__all__ = ["close", "open_episode", "step"]
