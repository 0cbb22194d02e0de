"""Tasks as clients see them: resolve and check a submission, store it, enqueue it, read it back.

Imported by the API (and the CLI). Every read takes the tenant, so another
tenant's task is simply not found (invariant 6). A task is enqueued on Redis
only after its row is committed (invariant 1).
"""

from __future__ import annotations

import logging
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import Select, select, tuple_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.bus import queue
from app.config import Settings
from app.db import models
from app.db.engine import Sessions, one_statement
from app.domain.resolve import check_inputs, resolve_spec
from app.domain.trajectory_format import reference_trajectory
from app.errors import InvalidInput
from app.ids import new_task_id, utc_now
from app.schemas.tasks import (
    ActionOut,
    ForkOut,
    SkippedArtifact,
    StepOut,
    TaskCreate,
    TaskList,
    TaskOut,
    TrajectoryOut,
    UsageOut,
    VerificationOut,
)
from app.services.cursors import decode_cursor, encode_cursor
from app.services.events import record_event
from app.services.images import admission as image_admission
from app.services.images.own import own_images
from app.services.tasks import backpressure, idempotency
from app.services.tasks.filters import TaskFilters
from app.services.visibility import find_task
from app.services.webhooks import service as webhooks
from app.specs import TaskSpec, read_spec, stored
from app.states import FinishReason, TaskStatus

log = logging.getLogger(__name__)
MAX_PAGE = 100


# Storing and reading tasks


async def submit_task(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    tenant: str,
    body: TaskCreate,
    idempotency_key: str | None,
) -> tuple[TaskOut, bool]:
    """Store a queued task and enqueue it; (task, created), or the first task for a repeated key."""
    async with sessions() as session:
        mine = await own_images(session, settings, tenant, body.sandbox.image)
    resolved = resolve_spec(body, settings, tenant=tenant, own=mine)
    if resolved.llm.profile != body.llm.profile:
        log.info(
            "a task of %s names no llm profile: it runs on %r, the only one configured "
            "(set SANDHIVE_LLM_BASE_URL and SANDHIVE_LLM_MODEL for a real model)",
            tenant,
            resolved.llm.profile,
        )
    spec = await with_webhook(sessions, settings, tenant, body, resolved)
    files = check_inputs(body, settings)
    submitted = idempotency.fingerprint(body, files) if idempotency_key is not None else None
    if idempotency_key is not None and (found := await _by_key(sessions, tenant, idempotency_key)):
        return _repeat(found, idempotency_key, submitted), False
    await image_admission.check_image_workers(redis, settings, [spec.sandbox.image_name])
    try:
        async with sessions.begin() as session:
            task = await store_task(
                session, _new_task(tenant, body, spec, idempotency_key, submitted), files
            )
            # Last: the tenant's lock is held from here to the commit (429 rolls back).
            await backpressure.admit(session, settings, tenant, added=True)
    except IntegrityError:
        # Two requests raced with one key: the unique constraint let only one in.
        if idempotency_key is None or not (
            found := await _by_key(sessions, tenant, idempotency_key)
        ):
            raise
        return _repeat(found, idempotency_key, submitted), False
    # Invariant 1: the row is committed before any worker can hear of it.
    try:
        await queue.enqueue(redis, task.id, spec.sandbox.image_name)
    except (RedisError, OSError) as exc:
        # Accepted all the same: the workers' reconciliation enqueues committed rows.
        log.warning("could not enqueue %s (reconciliation will): %r", task.id, exc)
    return task_out(task), True


async def with_webhook(
    sessions: Sessions, settings: Settings, tenant: str, body: TaskCreate, spec: TaskSpec
) -> TaskSpec:
    """The spec with the submission's own webhook checked and pinned to its signer."""
    if body.webhook is None:
        return spec
    own = await webhooks.own_webhook(
        sessions, settings, tenant, body.webhook.url, list(body.webhook.events), ("webhook",)
    )
    return spec.model_copy(update={"webhook": own})


async def store_task(
    session: AsyncSession, task: models.Task, files: list[tuple[str, bytes]]
) -> models.Task:
    """Add a new queued task, its input files and its `task.queued` event to the transaction."""
    session.add(task)
    await session.flush()  # the row first: inputs and events reference it
    session.add_all(models.InputBlob(task_id=task.id, path=p, content=c) for p, c in files)
    await record_event(session, task.id, "task.queued", {"status": TaskStatus.queued})
    return task


def new_task(tenant: str, body: TaskCreate, spec: TaskSpec) -> models.Task:
    """A queued task's row, as a submission without an Idempotency-Key makes it."""
    return _new_task(tenant, body, spec, None, None)


def _new_task(
    tenant: str,
    body: TaskCreate,
    spec: TaskSpec,
    idempotency_key: str | None,
    fingerprint: str | None,
) -> models.Task:
    return models.Task(
        id=new_task_id(),
        tenant_id=tenant,
        status=TaskStatus.queued,
        prompt=body.prompt,
        spec=stored(spec),
        meta=body.metadata,
        attempt=0,
        usage=UsageOut().model_dump(),
        idempotency_key=idempotency_key,
        idempotency_fingerprint=fingerprint,
        last_seq=0,
        created_at=utc_now(),
    )


def _repeat(first: models.Task, key: str, submitted: str | None) -> TaskOut:
    """The first task of a repeated key (422 if the key came with another submission)."""
    idempotency.check_repeat(first, key, submitted or "")
    return task_out(first)


async def _by_key(sessions: Sessions, tenant: str, key: str) -> models.Task | None:
    async with sessions() as session:
        return await session.scalar(
            select(models.Task).where(
                models.Task.tenant_id == tenant, models.Task.idempotency_key == key
            )
        )


async def get_task(sessions: Sessions, tenant: str, task_id: str) -> TaskOut:
    async with one_statement(sessions)() as session:  # clients poll it
        return task_out(await find_task(session, tenant, task_id))


async def list_tasks(
    sessions: Sessions,
    tenant: str,
    *,
    status: TaskStatus | None = None,
    limit: int = 20,
    cursor: str | None = None,
    filters: TaskFilters | None = None,
) -> TaskList:
    """Newest first, `limit` per page; `next_cursor` continues after the last item.

    The filters narrow the same walk down the (tenant, created_at) index, so a cursor from a
    filtered page continues the filtered list (the cursor is a position, not a query).
    """
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"limit must be between 1 and {MAX_PAGE}")
    query = _page_query(tenant, status, cursor)
    if filters is not None:
        query = filters.apply(query)
    async with sessions() as session:
        rows = list(await session.scalars(query.limit(limit + 1)))
    page = rows[:limit]
    more = len(rows) > limit
    return TaskList(
        items=[task_out(row) for row in page],
        next_cursor=encode_cursor(page[-1].created_at, page[-1].id) if more else None,
    )


def _page_query(tenant: str, status: TaskStatus | None, cursor: str | None) -> Select[models.Task]:
    task = models.Task
    query = select(task).where(task.tenant_id == tenant)
    if status is not None:
        query = query.where(task.status == status)
    if cursor is not None:
        created_at, task_id = decode_cursor(cursor)
        query = query.where(tuple_(task.created_at, task.id) < tuple_(created_at, task_id))
    return query.order_by(task.created_at.desc(), task.id.desc())


async def get_trajectory(
    sessions: Sessions, tenant: str, task_id: str, attempt: int | None = None
) -> TrajectoryOut:
    """Every recorded step of every attempt (or of one), also while the task runs."""
    query = select(models.Step).where(models.Step.task_id == task_id)
    if attempt is not None:
        query = query.where(models.Step.attempt == attempt)
    async with sessions() as session:
        await find_task(session, tenant, task_id)
        rows = await session.scalars(query.order_by(models.Step.attempt, models.Step.index))
        return TrajectoryOut(task_id=task_id, steps=[step_of_row(row) for row in rows])


async def get_reference_trajectory(
    sessions: Sessions, tenant: str, task_id: str, attempt: int | None = None
) -> dict[str, Any]:
    """The package's trajectory.json for one attempt (default: the latest), as `sandhive run`."""
    async with sessions() as session:
        task = await find_task(session, tenant, task_id)
        chosen = attempt if attempt is not None else task.attempt
        rows = await session.scalars(
            select(models.Step)
            .where(models.Step.task_id == task_id, models.Step.attempt == chosen)
            .order_by(models.Step.index)
        )
        return reference_trajectory(task.prompt, [step_of_row(row) for row in rows])


def step_of_row(row: models.Step) -> StepOut:
    return StepOut(
        index=row.index,
        attempt=row.attempt,
        thought=row.thought,
        reasoning=row.reasoning,
        action=ActionOut.model_validate(row.action) if row.action is not None else None,
        observation=row.observation,
        exit_code=row.exit_code,
        started_at=row.started_at,
        llm_ms=row.llm_ms,
        tool_ms=row.tool_ms,
        prompt_tokens=row.prompt_tokens,
        completion_tokens=row.completion_tokens,
        interrupted=row.interrupted,
    )


def skipped_of(row: models.Task) -> list[SkippedArtifact]:
    """The task's output files that did not become artifacts."""
    return [SkippedArtifact.model_validate(item) for item in row.artifacts_skipped or []]


def task_out(row: models.Task) -> TaskOut:
    """The one mapping from a task row to the wire model."""
    spec = read_spec(row.spec)
    return TaskOut(
        id=row.id,
        status=TaskStatus(row.status),
        finish_reason=FinishReason(row.finish_reason) if row.finish_reason else None,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        prompt=row.prompt,
        llm=spec.llm,
        limits=spec.limits,
        sandbox=spec.sandbox,
        tools=spec.tools,
        prompt_config=spec.prompt_config,
        mode=spec.mode,
        metadata=row.meta,
        attempt=row.attempt,
        answer=row.answer,
        usage=UsageOut.model_validate(row.usage),
        error=row.error,
        artifacts_skipped=skipped_of(row),
        webhook=spec.webhook,
        verification=VerificationOut.model_validate(row.verification) if row.verification else None,
        fork=_fork_of(spec, row),
    )


def _fork_of(spec: TaskSpec, row: models.Task) -> ForkOut | None:
    fork = spec.fork
    if fork is None:
        return None
    return ForkOut(
        parent_id=fork.task_id,
        step=fork.step,
        allow_divergence=fork.allow_divergence,
        rebuild=fork.rebuild,
        diverged=row.diverged,
    )
