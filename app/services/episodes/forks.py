"""The API's side of a fork: an open episode's children, made on the worker that holds it.

The children's rows are stored first (`opening`, counted against the tenant's cap with
the parent: a 429 there writes nothing), then the parent's worker is asked to fork: it
takes the snapshot under the parent's lock and starts every child from it, on itself,
since the snapshot is in its memory. When it refuses (no free slots, a snapshot over the
limit, the parent ended meanwhile), or gives no answer, the children no worker took are
deleted again: a refused fork leaves nothing behind.
"""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis

from app.bus import episodes as bus
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.errors import AppError, Conflict, InvalidInput, TooManyRequests
from app.schemas.episodes import EpisodeForkOut, EpisodeOpened
from app.services.episodes import service as rows
from app.services.episodes.calls import FULL_RETRY_S, call_worker
from app.services.episodes.holders import HOLDERS
from app.specs import TaskSpec, read_spec

REFUSALS: dict[int, type[AppError]] = {409: Conflict, 422: InvalidInput}


async def fork(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, episode_id: str, n: int
) -> EpisodeForkOut:
    started = time.monotonic()
    parent = await rows.find(sessions, tenant, episode_id)
    if n > settings.fork_max_children:
        raise InvalidInput(
            f"n is {n}; a fork makes at most {settings.fork_max_children} children"
            " (SANDHIVE_FORK_MAX_CHILDREN)",
            details={"limit": "fork_max_children", "value": settings.fork_max_children},
        )
    if parent.status != "open" or parent.worker is None:
        raise Conflict(
            f"the episode is {parent.status} ({parent.finish_reason}): its sandbox is gone, so"
            " it cannot be forked. What is still possible: open a new episode with the same"
            " body and replay its trajectory's tool calls (GET /v1/episodes/{id}/trajectory)",
            details={"status": parent.status, "finish_reason": parent.finish_reason},
        )
    if (why := unforkable(read_spec(parent.spec["task"]), settings)) is not None:
        raise InvalidInput(f"this episode cannot be forked: {why}")
    children = rows.children_of(parent, n)
    await rows.store(sessions, settings, *children)
    ids = [child.id for child in children]
    request = {"op": "fork", "episode_id": parent.id, "children": ids}
    try:
        reply = await call_worker(
            sessions,
            redis,
            parent,
            parent.worker,
            request,
            settings.fork_timeout_s,
            slow_is_lost=False,
        )
        if "refused" in reply:
            raise _refusal(reply)
        if "children" not in reply:  # the parent ended meanwhile (its row's end came back)
            raise Conflict(f"the episode ended ({reply.get('finish_reason')}) before it forked")
        return await _forked(sessions, parent, reply, started)
    except BaseException:
        HOLDERS.forget(parent.id)
        await _undo(sessions, redis, parent.worker, ids)
        raise


async def _undo(sessions: Sessions, redis: Redis, worker: str, ids: list[str]) -> None:
    """A fork that failed leaves no child: rows no worker took are deleted, and any its
    worker did start (it answered too late) are closed there, their rows ending `closed`."""
    await rows.discard(sessions, ids)
    for child in await rows.find_many(sessions, ids, missing_ok=True):
        if child.status in rows.ACTIVE:
            await bus.send(redis, worker, {"op": "close", "episode_id": child.id})


def unforkable(spec: TaskSpec, settings: Settings) -> str | None:
    """Why an episode of this spec cannot be forked (its state is more than its files)."""
    if spec.tools.shell == "persistent":
        return (
            "its shell is persistent, and a shell's state (working directory, variables,"
            " background jobs) cannot be copied; fork episodes with the fresh shell"
        )
    if not (spec.sandbox.read_only_rootfs and settings.sandbox_read_only_rootfs):
        return "its root filesystem is writable, and only the writable directories are copied"
    return None


def _refusal(reply: dict[str, Any]) -> AppError:
    status = int(reply.get("status", 409))
    if status == 429:
        return TooManyRequests(str(reply["refused"]), FULL_RETRY_S, details=reply.get("details"))
    error = REFUSALS.get(status, Conflict)
    return error(str(reply["refused"]), details=reply.get("details"))


async def _forked(
    sessions: Sessions, parent: models.EpisodeRow, reply: dict[str, Any], started: float
) -> EpisodeForkOut:
    """The children as they are now (a child that could not start says so in its row)."""
    answers: dict[str, dict[str, Any]] = reply["children"]
    found = await rows.find_many(sessions, list(answers))
    children = [
        EpisodeOpened(
            **rows.out(row).model_dump(),
            messages=answers[row.id].get("messages", []),
            tools=answers[row.id].get("tools", []),
        )
        for row in found
    ]
    timings = {**reply["timings"], "api_ms": int((time.monotonic() - started) * 1000)}
    return EpisodeForkOut(
        parent_id=parent.id, step=int(reply["step"]), children=children, timings=timings
    )
