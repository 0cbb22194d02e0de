"""Batch submission: many tasks checked, admitted and stored as one, or not at all.

A caller that fans work out wants one answer for the whole batch: either every
task is queued or nothing is, so it never has to find and clean up half a
batch. Every task is resolved against the server's limits before anything is
stored, the tenant's limits are checked for the batch's size in the same
transaction that inserts it, and each task may carry its own idempotency key
with the single submission's rules (a key names one task, whichever route made
it). Enqueueing follows the commit, as for one task (invariant 1).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.bus import queue
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.domain.resolve import check_inputs, dotted, problem, resolve_spec
from app.errors import AppError, IdempotencyKeyReused, InvalidInput
from app.schemas.batches import TaskBatchCreate, TaskBatchItem, TaskBatchOut
from app.schemas.tasks import TaskCreate
from app.services.images import admission as image_admission
from app.services.images.task_images import image_name
from app.services.tasks import backpressure, idempotency
from app.services.tasks.service import new_task, store_task, task_out, with_webhook
from app.specs import TaskSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Item:
    """One task of the batch, resolved and ready to store."""

    index: int
    body: TaskCreate
    spec: TaskSpec
    files: list[tuple[str, bytes]]
    key: str | None
    fingerprint: str | None


async def submit_batch(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, batch: TaskBatchCreate
) -> TaskBatchOut:
    """Queue every task of the batch, or none (422 naming `tasks.N.field`, or 429)."""
    if len(batch.tasks) > settings.max_batch_tasks:
        msg = f"at most {settings.max_batch_tasks} tasks in one batch, got {len(batch.tasks)}"
        raise InvalidInput(f"tasks: {msg}", details=[problem(("tasks",), msg, "too_long")])
    items = [_prepare(i, task, settings, tenant) for i, task in enumerate(batch.tasks)]
    for n, item in enumerate(items):
        with _located(item.index):
            spec = await with_webhook(sessions, settings, tenant, item.body, item.spec)
        items[n] = replace(item, spec=spec)
    _check_keys_unique(items)
    try:
        return await _store(sessions, redis, settings, tenant, items)
    except IntegrityError:
        # A concurrent submission took one of the keys first: the second pass finds it
        # and answers it as a repeat (or a 422 if it came with another task).
        return await _store(sessions, redis, settings, tenant, items)


def _prepare(index: int, task: TaskBatchItem, settings: Settings, tenant: str) -> _Item:
    fields = task.model_fields_set - {"idempotency_key"}
    body = TaskCreate(**{name: getattr(task, name) for name in fields})
    with _located(index):
        spec = resolve_spec(body, settings, tenant=tenant)
        files = check_inputs(body, settings)
    key = task.idempotency_key
    submitted = idempotency.fingerprint(body, files) if key is not None else None
    return _Item(index, body, spec, files, key, submitted)


@contextmanager
def _located(index: int) -> Iterator[None]:
    """Re-raise a task's own 4xx with its place in the batch: `tasks.3.limits.max_steps`."""
    try:
        yield
    except AppError as exc:
        if not isinstance(exc.details, list) or not all(
            isinstance(d, dict) and d.get("loc", [None])[:1] == ["body"] for d in exc.details
        ):
            raise type(exc)(f"tasks.{index}: {exc.message}", exc.details) from exc
        details: list[dict[str, Any]] = [
            {**d, "loc": ["body", "tasks", index, *d["loc"][1:]]} for d in exc.details
        ]
        message = "; ".join(f"{dotted(tuple(d['loc'][1:]))}: {d['msg']}" for d in details)
        raise type(exc)(message, details) from exc


def _check_keys_unique(items: list[_Item]) -> None:
    """One key names one task: a batch cannot use a key twice."""
    seen: dict[str, int] = {}
    for item in items:
        if item.key is None:
            continue
        if item.key in seen:
            loc = ("tasks", item.index, "idempotency_key")
            msg = f"{item.key!r} is also the key of tasks.{seen[item.key]}"
            raise InvalidInput(f"{dotted(loc)}: {msg}", details=[problem(loc, msg)])
        seen[item.key] = item.index


async def _store(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, items: list[_Item]
) -> TaskBatchOut:
    found = await _by_keys(sessions, tenant, [item.key for item in items if item.key is not None])
    for item in items:
        if item.key is not None and item.key in found:
            _check_repeat(item, found[item.key])
    fresh = [item for item in items if item.key is None or item.key not in found]
    stored: dict[int, models.Task] = {}
    images = [item.spec.sandbox.image_name for item in fresh]
    await image_admission.check_image_workers(redis, settings, images)  # or 503, none stored
    if fresh:
        made = {item.index: _row(tenant, item) for item in fresh}  # ids in the batch's order
        async with sessions.begin() as session:
            # Keys inserted in one order by every batch: two batches sharing keys wait for
            # each other's unique-index entries in turn instead of deadlocking (the tenant's
            # lock comes after the inserts).
            for item in sorted(fresh, key=lambda i: (i.key is None, i.key or "")):
                stored[item.index] = await store_task(session, made[item.index], item.files)
            # Last, as a single submission's: the tenant's lock is not held for the inserts.
            await backpressure.admit(session, settings, tenant, count=len(fresh), added=True)
    await _enqueue(redis, list(stored.values()))
    rows = [stored.get(item.index) or found[item.key or ""] for item in items]
    return TaskBatchOut(
        tasks=[task_out(row) for row in rows], created=[item.index in stored for item in items]
    )


def _row(tenant: str, item: _Item) -> models.Task:
    row = new_task(tenant, item.body, item.spec)
    row.idempotency_key = item.key
    row.idempotency_fingerprint = item.fingerprint
    return row


def _check_repeat(item: _Item, first: models.Task) -> None:
    """The single submission's rule, located at the task's `idempotency_key` field."""
    try:
        idempotency.check_repeat(first, item.key or "", item.fingerprint or "")
    except IdempotencyKeyReused as exc:
        loc = ("tasks", item.index, "idempotency_key")
        msg = f"{item.key!r} was used for a different submission ({first.id})"
        raise IdempotencyKeyReused(
            f"{dotted(loc)}: {msg}: a retry must send the same task, a new task needs a new key",
            details=[problem(loc, msg, "idempotency_key_reused")],
        ) from exc


async def _by_keys(sessions: Sessions, tenant: str, keys: list[str]) -> dict[str, models.Task]:
    if not keys:
        return {}
    async with sessions() as session:
        rows = await session.scalars(
            select(models.Task).where(
                models.Task.tenant_id == tenant, models.Task.idempotency_key.in_(keys)
            )
        )
        return {row.idempotency_key: row for row in rows if row.idempotency_key is not None}


async def _enqueue(redis: Redis, rows: list[models.Task]) -> None:
    for row in rows:
        task_id = row.id
        try:
            await queue.enqueue(redis, task_id, image_name(row.spec))
        except (RedisError, OSError) as exc:
            # Accepted all the same: the workers' reconciliation enqueues committed rows.
            log.warning("could not enqueue %s (reconciliation will): %r", task_id, exc)
