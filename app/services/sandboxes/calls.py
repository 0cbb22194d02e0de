"""The API's side of a sandbox's life: place it on a worker, delete it, move its deadline; and
the one way every request reaches the worker holding it and its answer comes back.

Creating picks the least busy live worker that has the image and sandbox slots (the rows
count each worker's sandboxes) and asks it over its own list (`app.bus.files`, kind
`sandboxes`); a worker with no free slot answers `full` and the next one is asked. Every
later request goes to the worker the row names. Whatever keeps an answer from coming becomes
a clear error, never a hang: a worker gone (its heartbeat missing twice, as the sweep
checks) ends the sandbox `worker_lost` (503); a live one that did not answer in time is a
504. Commands are `app.services.sandboxes.commands`, files `app.services.sandboxes.files`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from app.bus import files as bus
from app.bus import leases
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.errors import (
    AppError,
    Conflict,
    SandboxError,
    Unavailable,
    WorkerTimeout,
)
from app.schemas.images import BUILT_PREFIX
from app.schemas.sandboxes import SandboxCreate, SandboxOut
from app.services.sandboxes import builds, placement
from app.services.sandboxes import service as rows
from app.services.tasks.files import REFUSALS

KIND = "sandboxes"
"""The request lists of `app.bus.files` the workers' sandbox servers read."""
RETRY_S = rows.RETRY_S
ASK_EACH_S = 15.0
"""How long a create waits for one worker before asking the next."""
_REASONS = {"is_dir": "is_directory"}
"""The wire's name of a refusal where it differs from the sandbox's."""


@dataclass(frozen=True)
class Held:
    """A running sandbox and the worker holding it."""

    id: str
    worker: str


async def create(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, body: SandboxCreate
) -> SandboxOut:
    row, workers, ask_each_s = await _placed(sessions, redis, settings, tenant, body)
    await rows.store(sessions, settings, row)
    deadline = time.monotonic() + max(settings.sandbox_create_timeout_s, ask_each_s)
    why = "no worker started it in time"
    for worker in workers:
        left = min(deadline - time.monotonic(), ask_each_s)
        if left <= 0:
            break
        request = {"op": "create", "sandbox_id": row.id}
        sent = await bus.send(redis, worker, request, timeout_s=left, kind=KIND)
        reply = await bus.wait_reply(
            redis, sent.reply, timeout_s=left, alive=placement.worker_alive(redis, worker)
        )
        if reply is None:
            await bus.abandon(redis, sent)
            continue
        if "created" in reply:
            if isinstance(reply.get("sandbox"), dict):  # the row as the worker's update left it
                return SandboxOut.model_validate(reply["sandbox"])
            return rows.out(await rows.find(sessions, tenant, row.id))  # an older worker
        if "full" in reply:
            why = "every worker's sandbox slots are taken"
            continue
        why = str(reply.get("failure", reply))
        break
    if not await rows.end(sessions, row.id, "failed", f"could not start: {why}"):
        # Started after all, as the API gave up: the worker's answer was late.
        fresh = await rows.find(sessions, tenant, row.id)
        if fresh.status == "running":
            return rows.out(fresh)
    raise Unavailable(
        f"sandbox {row.id} could not start: {why}",
        RETRY_S,
        details={"sandbox_id": row.id, "error_kind": "infrastructure"},
    )


async def _placed(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, body: SandboxCreate
) -> tuple[models.SandboxRow, list[str], float]:
    """The checked row, the workers to ask in turn, and how long each gets (503 when none
    can start it)."""
    own = await builds.own_images(sessions, settings, tenant) if _built(body.image) else {}
    row = rows.new_row(settings, tenant, body, {name: it.image for name, it in own.items()})
    image = row.spec["sandbox"]["image_name"]
    built = own.get(image)
    if built is not None:  # a worker lacking it builds it from the stored Dockerfile first
        row.spec["built"] = built.provenance()
        image = built.base
    workers = await placement.candidates(sessions, redis, image)
    ask_each_s = ASK_EACH_S
    if built is not None:
        # The worker that built it has it; another may have to build it first, so it is
        # given that long rather than a second worker being asked to build it too.
        workers.sort(key=lambda name: name != built.worker)
        ask_each_s = settings.sandbox_create_timeout_s + settings.image_build_timeout_s
    if not workers:
        raise Unavailable(
            f"no live worker can start a sandbox of the image {image!r} (start one: sandhive"
            " worker, with SANDHIVE_SANDBOX_SLOTS above 0; or build the image there:"
            " sandhive image build)",
            RETRY_S,
            details={"error_kind": "infrastructure"},
        )
    return row, workers, ask_each_s


def _built(image: str) -> bool:
    return image.startswith(BUILT_PREFIX)


async def held(sessions: Sessions, tenant: str, sandbox_id: str) -> Held:
    """The running sandbox's worker; 404 (other tenants too), 409 unless it runs."""
    row = await rows.find(sessions, tenant, sandbox_id)
    if row.status != "running" or row.worker is None:
        if row.status == "starting":
            raise Conflict(
                f"sandbox {sandbox_id} is still starting", details={"status": "starting"}
            )
        raise rows.ended_conflict(row)
    return Held(row.id, row.worker)


async def delete(sessions: Sessions, redis: Redis, tenant: str, sandbox_id: str) -> SandboxOut:
    """End it and remove its container; deleting an ended one changes nothing."""
    row = await rows.find(sessions, tenant, sandbox_id)
    if row.status == "running" and row.worker is not None:
        request = {"op": "delete", "sandbox_id": row.id}
        sent = await bus.send(redis, row.worker, request, timeout_s=ASK_EACH_S, kind=KIND)
        alive = placement.worker_alive(redis, row.worker)
        if await bus.wait_reply(redis, sent.reply, timeout_s=ASK_EACH_S, alive=alive) is None:
            await bus.abandon(redis, sent)
    # Its worker ended it before answering; or is gone, or slow: ended here, and the
    # worker's upkeep (which reads the row) or the reaper removes the container.
    await rows.end(sessions, row.id, "deleted")
    return rows.out(await rows.find(sessions, tenant, sandbox_id))


async def extend(
    sessions: Sessions, settings: Settings, tenant: str, sandbox_id: str, ttl_s: int
) -> SandboxOut:
    """Move its deadline in the row: its worker reads it every second."""
    return rows.out(await rows.extend(sessions, settings, tenant, sandbox_id, ttl_s))


async def send(redis: Redis, box: Held, request: dict[str, Any], timeout_s: float) -> bus.Sent:
    """A request for the worker holding `box`, waited for `timeout_s` at most."""
    body = {**request, "sandbox_id": box.id}
    return await bus.send(redis, box.worker, body, timeout_s=timeout_s, kind=KIND)


async def wait(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    box: Held,
    sent: bus.Sent,
    timeout_s: float,
) -> dict[str, Any] | None:
    """The worker's next answer to `sent`, None after `timeout_s` from a live worker; the
    error it stands for otherwise (a lost worker, a refusal), the request abandoned."""
    alive = placement.worker_alive(redis, box.worker)
    reply = await bus.wait_reply(redis, sent.reply, timeout_s=timeout_s, alive=alive)
    if reply is None:
        gone = await leases.missing_twice(
            lambda names: leases.alive(redis, names),
            [box.worker],
            settings.worker_heartbeat_s,
        )
        if not gone:
            return None
        await bus.abandon(redis, sent)
        raise await _lost(sessions, box, f"its worker {box.worker} is gone")
    if "gone" in reply:
        await bus.abandon(redis, sent)
        row = await rows.get(sessions, box.id)
        if row is not None and row.status == "ended":
            raise rows.ended_conflict(row)
        raise await _lost(sessions, box, f"its worker {box.worker} no longer holds it")
    if "failure" in reply:
        raise SandboxError(f"sandbox {box.id}: {reply['failure']}")
    if "refused" in reply:
        kind, message = str(reply["refused"]), str(reply.get("message", ""))
        if kind == "timeout":
            raise WorkerTimeout(message)
        details = {"reason": _REASONS.get(kind, kind), "path": reply.get("path")}
        raise REFUSALS.get(kind, SandboxError)(message, details)
    return reply


async def reply(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    box: Held,
    sent: bus.Sent,
    timeout_s: float,
) -> dict[str, Any]:
    """`wait`, a 504 when a live worker did not answer in time."""
    answer = await wait(sessions, redis, settings, box, sent, timeout_s)
    if answer is None:
        await bus.abandon(redis, sent)
        raise WorkerTimeout(
            f"worker {box.worker}, which holds sandbox {box.id}, did not answer in {timeout_s:g} s"
        )
    return answer


async def _lost(sessions: Sessions, box: Held, why: str) -> AppError:
    """End the sandbox as lost (its container goes with its worker); the 503 to raise."""
    await rows.end(sessions, box.id, "worker_lost", f"infrastructure: {why}")
    return Unavailable(
        f"sandbox {box.id} is lost: {why} (an infrastructure failure; make a new one)",
        RETRY_S,
        details={"sandbox_id": box.id, "end_reason": "worker_lost"},
    )
