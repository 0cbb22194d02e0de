"""Operator use cases: figures for `/metrics`, workers and their slots, drain, requeue, fail, prune.

Imported by the API (`/metrics`), the worker (the drain flag) and `sandhive
admin`. Workers are read from the heartbeat keys they renew in Redis
(`app.bus.leases.beat`); a drain is a Redis flag the worker reads at its next
heartbeat, after which it stops claiming, like on SIGTERM.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import timedelta

from redis.asyncio import Redis
from sqlalchemy import delete, func, select

from app.bus import cancel, keys, leases, queue
from app.db import models
from app.db.engine import Sessions
from app.errors import Conflict, NotFound
from app.ids import utc_now
from app.services.images.task_images import image_name
from app.services.tasks.lifecycle import TaskEnd, finish_row, lock_unfinished, publish_quietly
from app.states import FinishReason, TaskStatus

log = logging.getLogger(__name__)
DRAIN_TTL_S = 7 * 24 * 3600


@dataclass(frozen=True)
class WorkerInfo:
    name: str
    host: str
    pid: int
    slots: int
    busy: int
    draining: bool
    images: tuple[str, ...] = ()
    """The catalogue images its daemon has (it claims only their tasks)."""
    sandbox_slots: int | None = None
    """How many `/v1/sandboxes` sandboxes it holds at most (None: an older release's
    heartbeat, which does not say)."""


@dataclass(frozen=True)
class TaskFigures:
    by_status: dict[str, int]
    failed_by_reason: dict[str, int]
    oldest_queued_age_s: float
    lost_attempts: int


async def task_figures(sessions: Sessions) -> TaskFigures:
    """Counts for `/metrics`, straight from Postgres (the truth)."""
    async with sessions() as session:
        by_status = list(
            (
                await session.execute(
                    select(models.Task.status, func.count()).group_by(models.Task.status)
                )
            ).all()
        )
        by_reason = list(
            (
                await session.execute(
                    select(models.Task.finish_reason, func.count())
                    .where(models.Task.status == TaskStatus.failed)
                    .group_by(models.Task.finish_reason)
                )
            ).all()
        )
        oldest = await session.scalar(
            select(func.min(models.Task.created_at)).where(models.Task.status == TaskStatus.queued)
        )
        lost = await session.scalar(select(func.coalesce(func.sum(models.Task.lost_attempts), 0)))
    age = (utc_now() - oldest).total_seconds() if oldest is not None else 0.0
    return TaskFigures(
        by_status={str(row[0]): int(row[1]) for row in by_status},
        failed_by_reason={str(row[0] or "unknown"): int(row[1]) for row in by_reason},
        oldest_queued_age_s=max(age, 0.0),
        lost_attempts=int(lost or 0),
    )


async def stream_length(redis: Redis) -> int:
    """Entries in the task streams of every image (waiting or being worked on)."""
    return await queue.depth(redis)


async def list_workers(redis: Redis) -> list[WorkerInfo]:
    """Every worker whose heartbeat is alive, by name: a `SCAN` for their heartbeats, then
    all of them and their drain flags in one round trip (a sandbox's or an episode's
    placement reads this on every create)."""
    names = await leases.worker_names(redis)
    if not names:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        pipe.mget([keys.worker_heartbeat(name) for name in names])
        pipe.mget([keys.drain_flag(name) for name in names])
        beats, drains = await pipe.execute()
    found: list[WorkerInfo] = []
    for name, value, drain_flag in zip(names, beats, drains, strict=True):
        if value is None:  # expired since the SCAN
            continue
        info = json.loads(value)
        found.append(
            WorkerInfo(
                name=name,
                host=str(info.get("host", "")),
                pid=int(info.get("pid", 0)),
                slots=int(info.get("slots", 0)),
                busy=int(info.get("tasks", 0)),
                draining=drain_flag is not None,
                images=tuple(str(name) for name in info.get("images", [])),
                sandbox_slots=_int_or_none(info.get("sandbox_slots")),
            )
        )
    return sorted(found, key=lambda worker: worker.name)


async def drain(redis: Redis, worker: str) -> None:
    """Ask `worker` to stop claiming tasks and exit once its running ones are done.

    NotFound unless the worker is alive (its heartbeat): a mistyped name must not be
    reported as drained, nor leave a flag that stops a later worker of that name.
    """
    if not await redis.exists(keys.worker_heartbeat(worker)):
        raise NotFound(f"no live worker {worker!r} (see `sandhive admin workers`)")
    await redis.set(keys.drain_flag(worker), "1", ex=DRAIN_TTL_S)


async def draining(redis: Redis, worker: str) -> bool:
    return bool(await redis.exists(keys.drain_flag(worker)))


async def requeue(sessions: Sessions, redis: Redis, task_id: str) -> str:
    """Put an unfinished task on the queue again: a queued one, or a running one whose
    worker is gone (its lease is dropped, so the next worker runs it now as a new attempt,
    not once the lease expires).

    A task running on a live worker is refused (Conflict): that worker renews its lease,
    taking it back, and the requeued message would be dropped as a duplicate, so the
    command would say it worked and change nothing. `fail` ends such a task; `drain` hands
    a worker's tasks back.
    """
    async with sessions.begin() as session:
        task = await lock_unfinished(session, task_id)
        status, image = task.status, image_name(task.spec)
    if status == TaskStatus.running:
        holder = await redis.get(keys.task_lease(task_id))
        worker = leases.worker_of(holder.decode() if isinstance(holder, bytes) else holder or "")
        if worker and await leases.alive(redis, [worker]):
            raise Conflict(
                f"{task_id} is running on worker {worker}, which is alive: it keeps its "
                f"lease, so a requeue would change nothing. End the task with `sandhive admin "
                f"fail {task_id}`, or hand all of the worker's tasks back with `sandhive admin "
                f"drain {worker}`",
                details={"worker": worker},
            )
        await leases.drop(redis, task_id)
    await queue.enqueue(redis, task_id, image)
    return str(status)


async def fail(sessions: Sessions, redis: Redis, task_id: str, reason: str) -> None:
    """End an unfinished task as failed now; its worker's later writes are fenced off."""
    error = f"failed by an operator: {reason}" if reason else "failed by an operator"
    async with sessions.begin() as session:
        task = await lock_unfinished(session, task_id)
        was_running = task.status == TaskStatus.running
        events = await finish_row(session, task, TaskEnd(FinishReason.sandbox_error, error=error))
    await publish_quietly(redis, events)
    if was_running:
        await cancel.raise_flag(redis, task_id)  # stop its sandbox now, not at the next write
    log.info("task %s failed by an operator", task_id)


@dataclass(frozen=True)
class Pruned:
    tasks: int
    artifacts: int


async def prune(sessions: Sessions, *, task_days: float, artifact_days: float) -> Pruned:
    """Delete finished tasks (and all they own) and old tasks' artifacts, by finish time."""
    now = utc_now()
    task_cutoff = now - timedelta(days=task_days)
    artifact_cutoff = now - timedelta(days=artifact_days)
    finished = models.Task.finished_at.is_not(None)
    async with sessions.begin() as session:
        old_tasks = select(models.Task.id).where(finished, models.Task.finished_at < task_cutoff)
        gone = await session.execute(delete(models.Task).where(models.Task.id.in_(old_tasks)))
        old_outputs = select(models.Task.id).where(
            finished, models.Task.finished_at < artifact_cutoff
        )
        removed = await session.execute(
            delete(models.Artifact).where(models.Artifact.task_id.in_(old_outputs))
        )
    return Pruned(tasks=_count(gone), artifacts=_count(removed))


def _count(result: object) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
