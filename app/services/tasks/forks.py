"""Forks of a task from one of its steps (`POST /v1/tasks/{id}/fork`), rebuilt by replay.

A child is a new queued task of the parent's tenant: the parent's prompt, inputs and spec
(its model or limits replaced when asked), and `fork` naming the parent's attempt and the
step. Its worker plays the parent's recorded steps before that one again in a fresh
sandbox (`recorded_turns`, `app.runner.replay`), then asks the child's model. The parent
may be finished or still running: only its completed steps are replayed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.bus import queue
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.domain.resolve import resolve_fork
from app.errors import Conflict, InvalidInput, NotFound
from app.ids import new_task_id, utc_now
from app.schemas.tasks import TaskForkIn, TaskForkOut, UsageOut
from app.services.images import admission as image_admission
from app.services.tasks import backpressure, snapshots
from app.services.tasks.service import store_task, task_out
from app.services.visibility import find_task
from app.specs import ForkSpec, TaskSpec, read_spec, stored
from app.states import TaskStatus

log = logging.getLogger(__name__)
SUBMIT = "submit"


async def fork_task(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    tenant: str,
    task_id: str,
    body: TaskForkIn,
) -> TaskForkOut:
    """Queue `body.n` children of the tenant's task, each to replay its steps before
    `body.step`; 404 for another tenant's task or a step it never completed."""
    if body.n > settings.fork_max_children:
        raise InvalidInput(
            f"n is {body.n}; a fork makes at most {settings.fork_max_children} children"
            " (SANDHIVE_FORK_MAX_CHILDREN)",
            details={"limit": "fork_max_children", "value": settings.fork_max_children},
        )
    async with sessions() as session:
        parent = await find_task(session, tenant, task_id)
        spec = read_spec(parent.spec)
        await _check_steps(session, parent, body.step)
        if body.rebuild == "snapshot":
            await _check_snapshot(session, parent, spec, body.step)
        inputs = [
            (row.path, row.content)
            for row in await session.scalars(
                select(models.InputBlob).where(models.InputBlob.task_id == parent.id)
            )
        ]
    fork = ForkSpec(
        task_id=parent.id,
        attempt=parent.attempt,
        step=body.step,
        allow_divergence=body.allow_divergence,
        rebuild=body.rebuild,
    )
    child = resolve_fork(spec, fork, settings, llm=body.llm, limits=body.limits)
    if child.limits.max_steps <= body.step:
        raise InvalidInput(
            f"limits.max_steps is {child.limits.max_steps}: the child would have no step of"
            f" its own after the {body.step} it replays"
        )
    await image_admission.check_image_workers(redis, settings, [child.sandbox.image_name])
    async with sessions.begin() as session:
        rows = [await store_task(session, _child_row(parent, child), inputs) for _ in range(body.n)]
        await backpressure.admit(session, settings, tenant, body.n, added=True)
    for row in rows:  # committed first: a worker never hears of a task it cannot read
        try:
            await queue.enqueue(redis, row.id, child.sandbox.image_name)
        except (RedisError, OSError) as exc:
            log.warning("could not enqueue %s (reconciliation will): %r", row.id, exc)
    return TaskForkOut(parent_id=parent.id, step=body.step, tasks=[task_out(r) for r in rows])


async def _check_steps(session: AsyncSession, parent: models.Task, step: int) -> None:
    """The parent's steps before `step` were all completed by its latest attempt (404),
    and none of them ended it (409: a `submit` is its last step, with nothing after it).
    A vanilla task takes no steps: it forks at 0 only (its one call, another model's)."""
    rows = list(
        await session.execute(
            select(models.Step.index, models.Step.action, models.Step.interrupted)
            .where(
                models.Step.task_id == parent.id,
                models.Step.attempt == parent.attempt,
                models.Step.index < step,
            )
            .order_by(models.Step.index)
        )
    )
    completed = [row for row in rows if row.interrupted is None]
    if len(completed) < step:
        raise NotFound(
            f"task {parent.id} has no completed step {step - 1} to fork after: its attempt"
            f" {parent.attempt} completed {len(completed)} of the steps before it",
            details={"completed_steps": len(completed)},
        )
    for row in completed:
        if (row.action or {}).get("tool") == SUBMIT:
            raise Conflict(
                f"step {row.index} of task {parent.id} submitted (the task ended there):"
                f" fork at step {row.index} or before",
                details={"submitted_at": row.index},
            )


async def _check_snapshot(
    session: AsyncSession, parent: models.Task, spec: TaskSpec, step: int
) -> None:
    """A fork from a snapshot needs the parent's files after step `step - 1` (none at 0:
    the fresh sandbox and its inputs are the start); 409 saying what is still possible."""
    if step == 0 or await snapshots.stored(session, parent.id, parent.attempt, step - 1):
        return
    why = (
        "it ran without `sandbox.snapshots: steps`"
        if spec.sandbox.snapshots != "steps"
        else "that step stored none (its files were over SANDHIVE_SNAPSHOT_MAX_MB)"
    )
    raise Conflict(
        f"task {parent.id} has no snapshot after step {step - 1}: {why}. What is still"
        ' possible: "rebuild": "replay"',
        details={"rebuild": "replay"},
    )


def _child_row(parent: models.Task, spec: TaskSpec) -> models.Task:
    return models.Task(
        id=new_task_id(),
        tenant_id=parent.tenant_id,
        status=TaskStatus.queued,
        prompt=parent.prompt,
        spec=stored(spec),
        meta=parent.meta,
        attempt=0,
        usage=UsageOut().model_dump(),
        last_seq=0,
        created_at=utc_now(),
        parent_id=parent.id,
    )


@dataclass(frozen=True)
class RecordedStep:
    """One of the parent's steps a fork starts after: as stored, and its message."""

    index: int
    started_at: datetime
    thought: str
    reasoning: str
    action: dict[str, Any] | None
    observation: str
    exit_code: int | None
    llm_ms: int
    tool_ms: int
    prompt_tokens: int
    completion_tokens: int
    message: dict[str, Any]
    """The assistant message as its model sent it. Steps stored before messages were kept
    get one rebuilt from the step's text and tool call (its call id `call_<index>`: not byte
    for byte)."""


async def recorded_steps(sessions: Sessions, fork: ForkSpec) -> list[RecordedStep]:
    """The parent's steps before the fork's `step`, in order."""
    Step = models.Step
    async with sessions() as session:
        rows = list(
            await session.execute(
                select(
                    Step.index,
                    Step.started_at,
                    Step.thought,
                    Step.reasoning,
                    Step.action,
                    Step.observation,
                    Step.exit_code,
                    Step.llm_ms,
                    Step.tool_ms,
                    Step.prompt_tokens,
                    Step.completion_tokens,
                    Step.message,
                )
                .where(
                    Step.task_id == fork.task_id,
                    Step.attempt == fork.attempt,
                    Step.index < fork.step,
                )
                .order_by(Step.index)
            )
        )
    if len(rows) != fork.step:
        raise InvalidInput(
            f"the parent task {fork.task_id} no longer has the {fork.step} steps to replay"
        )
    return [
        RecordedStep(**{**row._asdict(), "message": row.message or _rebuilt(row)}) for row in rows
    ]


async def snapshot_of(sessions: Sessions, fork: ForkSpec) -> bytes:
    """The parent's files after the step before the branch (`rebuild: snapshot`)."""
    archive = await snapshots.load(sessions, fork.task_id, fork.attempt, fork.step - 1)
    if archive is None:
        raise InvalidInput(f"the parent task {fork.task_id} no longer has its snapshot")
    return archive


def _rebuilt(row: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": row.thought}
    if row.action is not None:
        function = {"name": row.action["tool"], "arguments": json.dumps(row.action["arguments"])}
        message["tool_calls"] = [
            {"id": f"call_{row.index}", "type": "function", "function": function}
        ]
    return message
