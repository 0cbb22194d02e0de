"""The worker's use cases: start an attempt, record its steps and artifacts, finish the task.

Each function is one transaction that commits before anything is published to
Redis, so a live follower never sees an event Postgres does not have.
"""

from __future__ import annotations

import hashlib
import mimetypes
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db import models
from app.ids import utc_now
from app.schemas import EventOut, StepOut, TaskSpec, UsageOut
from app.services.events import FINISHED, publish, record_event
from app.states import FinishReason, TaskStatus, is_terminal, status_for

Sessions = async_sessionmaker[AsyncSession]


@dataclass(frozen=True)
class StartedAttempt:
    task_id: str
    tenant: str
    attempt: int
    prompt: str
    spec: TaskSpec
    inputs: list[tuple[str, bytes]]


async def start_attempt(
    sessions: Sessions, redis: Redis, task_id: str, worker: str
) -> StartedAttempt | None:
    """Mark the task running as a new attempt; None when it is unknown or already finished."""
    async with sessions.begin() as session:
        task = await session.scalar(
            select(models.Task).where(models.Task.id == task_id).with_for_update()
        )
        if task is None or is_terminal(TaskStatus(task.status)):
            return None
        task.attempt += 1
        task.status = TaskStatus.running
        task.started_at = task.started_at or utc_now()
        event = await record_event(
            session, task_id, "task.started", {"attempt": task.attempt, "worker": worker}
        )
        blobs = await session.scalars(
            select(models.InputBlob).where(models.InputBlob.task_id == task_id)
        )
        started = StartedAttempt(
            task_id=task.id,
            tenant=task.tenant_id,
            attempt=task.attempt,
            prompt=task.prompt,
            spec=TaskSpec.model_validate(task.spec),
            inputs=[(blob.path, blob.content) for blob in blobs],
        )
    await publish(redis, event)
    return started


async def step_started(sessions: Sessions, redis: Redis, task_id: str, index: int) -> None:
    await _record_and_publish(sessions, redis, task_id, "step.started", {"index": index})


async def save_step(sessions: Sessions, redis: Redis, task_id: str, step: StepOut) -> None:
    """Store one finished step and announce it."""
    async with sessions.begin() as session:
        session.add(
            models.Step(
                task_id=task_id,
                **step.model_dump(exclude={"action"}),
                action=step.action.model_dump() if step.action else None,
            )
        )
        event = await record_event(session, task_id, "step.completed", step.model_dump(mode="json"))
    await publish(redis, event)


async def save_artifacts(
    sessions: Sessions, redis: Redis, task_id: str, files: Sequence[tuple[str, bytes]]
) -> None:
    """Store the files the agent left in its output folder (replacing an earlier attempt's)."""
    events: list[EventOut] = []
    async with sessions.begin() as session:
        await session.execute(delete(models.Artifact).where(models.Artifact.task_id == task_id))
        for path, content in files:
            row = _artifact(task_id, path, content)
            session.add(row)
            info = {"path": path, "size": row.size, "content_type": row.content_type}
            events.append(await record_event(session, task_id, "artifact.created", info))
    for event in events:
        await publish(redis, event)


async def finish_task(
    sessions: Sessions,
    redis: Redis,
    task_id: str,
    *,
    reason: FinishReason,
    answer: str | None,
    usage: UsageOut,
    error: str | None,
) -> None:
    """Give the task its terminal status; the last durable event of the task."""
    status = status_for(reason)
    async with sessions.begin() as session:
        task = await session.get_one(models.Task, task_id, with_for_update=True)
        task.status = status
        task.finish_reason = reason
        task.answer = answer
        task.usage = usage.model_dump()
        task.error = error
        task.finished_at = utc_now()
        data = {
            "status": status,
            "finish_reason": reason,
            "answer": answer,
            "usage": usage.model_dump(),
            "error": error,
        }
        event = await record_event(session, task_id, FINISHED, data)
    await publish(redis, event)


async def _record_and_publish(
    sessions: Sessions, redis: Redis, task_id: str, type_: str, data: dict[str, object]
) -> None:
    async with sessions.begin() as session:
        event = await record_event(session, task_id, type_, data)
    await publish(redis, event)


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
