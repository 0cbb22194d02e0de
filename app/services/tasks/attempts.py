"""The worker's use cases: start an attempt, record its steps, finish or hand back the task.

Each function is one transaction that commits before anything is published to
Redis, so a live follower never sees an event Postgres does not have. Every
write of an attempt is fenced: it happens only while `tasks.attempt` is still
that attempt and the task is running, checked under the row lock, so a stale
worker (paused, partitioned, reclaimed) cannot overwrite a newer attempt.
"""

from __future__ import annotations

import hashlib
import mimetypes
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from redis.asyncio import Redis
from sqlalchemy import delete, func, literal_column, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

from app.db import models
from app.db.engine import Sessions
from app.errors import Conflict
from app.ids import utc_now
from app.schemas.tasks import EventOut, StepOut, storable
from app.services.events import record_event, record_events
from app.services.tasks import step_rows
from app.services.tasks.lifecycle import TaskEnd, finish_row, lock_row, publish_quietly
from app.services.tasks.notify import task_changed
from app.services.webhooks import service as webhooks
from app.specs import TaskSpec, read_spec
from app.states import FinishReason, TaskStatus, is_terminal, timeout_error

UNFINISHED = (TaskStatus.queued, TaskStatus.running)


class StaleAttempt(Conflict):
    """This attempt no longer owns its task: a newer attempt started, or the task ended."""


@dataclass(frozen=True)
class StartedAttempt:
    task_id: str
    tenant: str
    attempt: int
    prompt: str
    spec: TaskSpec
    inputs: list[tuple[str, bytes]]
    used_s: float
    """What earlier attempts ran of `timeout_s`: a later attempt (after a lost worker or a
    hand-back) gets only what is left. Time between attempts (waiting for a dead worker's
    lease, in the queue after a hand-back) is the infrastructure's, not the agent's: it
    does not count, so it can never end a task as `timeout`."""


async def start_attempt(
    sessions: Sessions, redis: Redis, task_id: str, worker: str, *, max_attempts: int
) -> StartedAttempt | None:
    """Mark the task running as a new attempt; None when there is nothing (more) to run.

    The caller holds the task's lease, so a task still `running` here lost its
    worker: that counts against `max_attempts`. A cancel asked for meanwhile
    ends the task without starting it, and so does a `timeout_s` already spent
    since the first attempt started.
    """
    started: StartedAttempt | None = None
    async with sessions.begin() as session:
        task = await lock_row(session, task_id)
        if task is None or is_terminal(TaskStatus(task.status)):
            return None
        lost = task.status == TaskStatus.running
        task.lost_attempts += int(lost)
        used_s = await _attempts_ran_s(session, task.id)
        ending = _ending_before_start(task, max_attempts, used_s)
        if ending is not None:
            events = await finish_row(session, task, ending)
        else:
            started, event = await _start(session, task, worker, lost, used_s)
            events = [event]
    await publish_quietly(redis, events)
    return started


async def _attempts_ran_s(session: AsyncSession, task_id: str) -> float:
    """How long the task's earlier attempts ran: each from its `task.started` event to the
    end of its last step (a lost attempt's time after its last step is not known, and is
    not charged). Both times of an attempt come from the one worker that ran it."""
    millisecond: ColumnElement[Any] = literal_column("interval '1 millisecond'")
    step_end = models.Step.started_at + (models.Step.llm_ms + models.Step.tool_ms) * millisecond
    ends = (
        select(models.Step.attempt, func.max(step_end).label("ended"))
        .where(models.Step.task_id == task_id)
        .group_by(models.Step.attempt)
        .subquery()
    )
    started = (  # one `task.started` event per attempt
        select(
            models.Event.data["attempt"].as_integer().label("attempt"), models.Event.ts.label("at")
        )
        .where(models.Event.task_id == task_id, models.Event.type == "task.started")
        .subquery()
    )
    ran = func.extract("epoch", ends.c.ended - started.c.at)
    total = await session.scalar(
        select(func.coalesce(func.sum(func.greatest(ran, 0)), 0)).select_from(
            ends.join(started, ends.c.attempt == started.c.attempt)
        )
    )
    return float(total or 0.0)


async def task_expiring(
    sessions: Sessions, task_id: str, attempt: int, expires_at: datetime
) -> bool:
    """`task.expiring` for the attempt that runs the task now, while it still runs; False
    when it ended or another attempt took it meanwhile (nothing is sent)."""
    async with sessions.begin() as session:
        found = (
            await session.execute(
                select(models.Task.tenant_id, models.Task.spec).where(models.Task.id == task_id)
            )
        ).first()
        if found is None or not await _listened(session, found.tenant_id, found.spec):
            return False  # nobody listens: no lock taken
        task = await session.scalar(
            select(models.Task).where(models.Task.id == task_id).with_for_update()
        )
        if task is None or task.status != TaskStatus.running or task.attempt != attempt:
            return False
        await task_changed(session, task, "task.expiring", expires_at=expires_at)
        return True


async def _listened(session: AsyncSession, tenant: str, spec: dict[str, Any]) -> bool:
    """Whether a subscription of the tenant, or the task's own webhook, wants
    `task.expiring`."""
    own = read_spec(spec).webhook
    if own is not None and "task.expiring" in own.events:
        return True
    return await webhooks.wanted(session, tenant, "task.expiring")


def _ending_before_start(task: models.Task, max_attempts: int, used_s: float) -> TaskEnd | None:
    """Why the task must end instead of starting another attempt, if it must."""
    if task.cancel_requested_at is not None:
        return TaskEnd(FinishReason.cancelled, error="cancelled")
    if task.lost_attempts >= max_attempts:
        error = f"the worker running it was lost {task.lost_attempts} times (max {max_attempts})"
        return TaskEnd(FinishReason.worker_lost, error=error)
    timeout_s = read_spec(task.spec).limits.timeout_s
    if used_s >= timeout_s:
        return TaskEnd(FinishReason.timeout, error=timeout_error(timeout_s))
    return None


async def _start(
    session: AsyncSession, task: models.Task, worker: str, lost: bool, used_s: float
) -> tuple[StartedAttempt, EventOut]:
    task.attempt += 1
    task.status = TaskStatus.running
    task.started_at = task.started_at or utc_now()
    data: dict[str, object] = {"attempt": task.attempt, "worker": worker}
    if lost:
        data["previous_attempt_lost"] = True
    event = await record_event(session, task.id, "task.started", data)
    await task_changed(session, task, "task.started")
    blobs = await session.scalars(
        select(models.InputBlob).where(models.InputBlob.task_id == task.id)
    )
    started = StartedAttempt(
        task_id=task.id,
        tenant=task.tenant_id,
        attempt=task.attempt,
        prompt=task.prompt,
        spec=read_spec(task.spec),
        inputs=[(blob.path, blob.content) for blob in blobs],
        used_s=used_s,
    )
    return started, event


async def step_started(
    sessions: Sessions, redis: Redis, task_id: str, attempt: int, index: int
) -> None:
    """Announce a step that no `save_step` announced (the first of an attempt)."""
    async with sessions.begin() as session:
        events = await _fenced_events(
            session, task_id, attempt, [("step.started", {"index": index})]
        )
    await publish_quietly(redis, events)


async def save_step(
    sessions: Sessions,
    redis: Redis,
    task_id: str,
    step: StepOut,
    next_index: int | None = None,
    *,
    capture: Mapping[str, Any] | None = None,
    message: Mapping[str, Any] | None = None,
) -> None:
    """Store one finished step of attempt `step.attempt` and announce it; `message`: its
    assistant message as the history sent it back (what a fork by replay plays again).

    With `next_index`, the next step's `step.started` rides in the same statement, right
    after this `step.completed`: one write per step on the hot path (`step_rows`), and
    readers still see completion N before the start of N+1.
    """
    data = storable(step.model_dump(mode="json"))  # binary output: no NUL in SQL
    items: list[tuple[str, Mapping[str, Any]]] = [("step.completed", data)]
    if next_index is not None:
        items.append(("step.started", {"index": next_index}))
    now = utc_now()
    last = await step_rows.store_step(
        sessions,
        task_id,
        step.attempt,
        data,
        step.started_at,
        items,
        now,
        capture=storable(dict(capture)) if capture is not None else None,  # `llm.capture`
        message=storable(dict(message)) if message is not None else None,
    )
    if last is None:
        raise StaleAttempt(f"attempt {step.attempt} of {task_id} no longer owns the task")
    first = last - len(items) + 1
    events = [
        EventOut(seq=first + i, type=type_, ts=now, task_id=task_id, data=dict(payload))
        for i, (type_, payload) in enumerate(items)
    ]
    await publish_quietly(redis, events)


async def _fenced_events(
    session: AsyncSession,
    task_id: str,
    attempt: int,
    items: Sequence[tuple[str, Mapping[str, Any]]],
) -> list[EventOut]:
    """Record events only while `attempt` runs the task (the bump takes the row lock)."""
    owns = (models.Task.attempt == attempt) & (models.Task.status == TaskStatus.running)
    events = await record_events(session, task_id, items, only_if=owns)
    if not events:
        raise StaleAttempt(f"attempt {attempt} of {task_id} no longer owns the task")
    return events


async def finish_task(
    sessions: Sessions,
    redis: Redis,
    task_id: str,
    attempt: int,
    outcome: TaskEnd,
    files: Sequence[tuple[str, bytes]] | None = None,
    skipped: Sequence[tuple[str, str]] = (),
) -> None:
    """Store the attempt's output files and give the task its terminal status, atomically.

    `skipped`: output files left out (caps, links, special files) as (path, reason).
    """
    async with sessions.begin() as session:
        task = await _fenced(session, task_id, attempt)
        events = [] if files is None else await _replace_artifacts(session, task_id, files)
        if files is not None:
            task.artifacts_skipped = [{"path": p, "reason": r} for p, r in skipped]
        events += await finish_row(session, task, outcome)
    await publish_quietly(redis, events)


async def hand_back(sessions: Sessions, redis: Redis, task_id: str, attempt: int) -> None:
    """A clean stop (worker shutdown): the task is queued again and this attempt is not lost."""
    async with sessions.begin() as session:
        task = await _fenced(session, task_id, attempt)
        task.status = TaskStatus.queued
        data = {"status": TaskStatus.queued, "attempt": attempt, "reason": "handed back"}
        event = await record_event(session, task_id, "task.queued", data)
    await publish_quietly(redis, [event])


# Reads for the worker's housekeeping (reconciliation, reaping, cancel backstop)


async def unfinished_tasks(sessions: Sessions, created_before: datetime) -> dict[str, TaskStatus]:
    """Queued and running tasks created before a moment, oldest first: id -> status."""
    query = (
        select(models.Task.id, models.Task.status)
        .where(models.Task.status.in_(UNFINISHED), models.Task.created_at < created_before)
        .order_by(models.Task.created_at)
    )
    async with sessions() as session:
        rows = (await session.execute(query)).all()
    return {task_id: TaskStatus(status) for task_id, status in rows}


async def task_states(sessions: Sessions, task_ids: Collection[str]) -> dict[str, tuple[str, int]]:
    """Status and current attempt of each known task among task_ids."""
    if not task_ids:
        return {}
    query = select(models.Task.id, models.Task.status, models.Task.attempt).where(
        models.Task.id.in_(list(task_ids))
    )
    async with sessions() as session:
        rows = (await session.execute(query)).all()
    return {task_id: (status, attempt) for task_id, status, attempt in rows}


async def cancel_requested(sessions: Sessions, task_ids: Collection[str]) -> set[str]:
    """The tasks among task_ids with a cancel on record."""
    if not task_ids:
        return set()
    query = select(models.Task.id).where(
        models.Task.id.in_(list(task_ids)), models.Task.cancel_requested_at.is_not(None)
    )
    async with sessions() as session:
        return set(await session.scalars(query))


async def _fenced(session: AsyncSession, task_id: str, attempt: int) -> models.Task:
    """The locked task row, or StaleAttempt unless `attempt` is its running attempt."""
    task = await lock_row(session, task_id)
    if task is None or task.attempt != attempt or task.status != TaskStatus.running:
        raise StaleAttempt(f"attempt {attempt} of {task_id} no longer owns the task")
    return task


async def _replace_artifacts(
    session: AsyncSession, task_id: str, files: Sequence[tuple[str, bytes]]
) -> list[EventOut]:
    """The attempt's output files replace whatever an earlier attempt stored."""
    events: list[EventOut] = []
    await session.execute(delete(models.Artifact).where(models.Artifact.task_id == task_id))
    for path, content in files:
        row = _artifact(task_id, path, content)
        session.add(row)
        info = {"path": path, "size": row.size, "content_type": row.content_type}
        events.append(await record_event(session, task_id, "artifact.created", info))
    return events


def _artifact(task_id: str, path: str, content: bytes) -> models.Artifact:
    content_type = mimetypes.guess_type(path)[0] or _sniff(content)
    return models.Artifact(
        task_id=task_id,
        path=path,
        size=len(content),
        content_type=content_type,
        sha256=hashlib.sha256(content).hexdigest(),
        content=content,
    )


def _sniff(content: bytes) -> str:
    """Text when it decodes as UTF-8, else opaque bytes."""
    try:
        content[:4096].decode("utf-8")
    except UnicodeDecodeError:
        return "application/octet-stream"
    return "text/plain; charset=utf-8"
