"""Experiments as clients see them: create (checked, stored, first items started), read,
list (newest first, paged), list items, cancel.

Imported by the API. Every read takes the tenant, so another tenant's experiment is simply
not found (invariant 6). Creating stores the experiment and all its items in one
transaction, then advances it once (`experiment_runner.advance`, what the workers' chore
does), so the first tasks exist when the 202 is sent.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.asyncio import Redis
from sqlalchemy import insert, select, tuple_, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.errors import AppError, Conflict, InvalidInput, NotFound
from app.ids import new_experiment_id, utc_now
from app.schemas.experiments import (
    ExperimentCreate,
    ExperimentList,
    ExperimentOut,
    ItemOut,
)
from app.services.cursors import decode_cursor, encode_cursor
from app.services.experiments.events import record_experiment_events
from app.services.experiments.input import Checked, check_experiment
from app.services.experiments.notify import experiment_finished
from app.services.experiments.outs import experiment_outs
from app.services.experiments.rows import store_rows
from app.services.experiments.runner import advance
from app.services.experiments.scoring import wake_followers
from app.services.images.own import own_images
from app.services.tasks import cancel
from app.services.webhooks import service as webhooks

log = logging.getLogger(__name__)
Item = models.ExperimentItem
ITEM_COLUMNS = tuple(ItemOut.model_fields)
DEFAULT_PAGE = 20
MAX_PAGE = 100
"""The page sizes of the task list (`services.tasks.MAX_PAGE`)."""


async def create_experiment(
    sessions: Sessions, redis: Redis, settings: Settings, tenant: str, body: ExperimentCreate
) -> ExperimentOut:
    """Check, store and start an experiment (422 naming the row and field; nothing stored)."""
    boxes = [arm.task.get("sandbox") for arm in body.arms]
    wanted = [str(box.get("image")) for box in boxes if isinstance(box, dict)]
    wanted += [str(row.get("image")) for row in body.dataset.rows if "image" in row]
    async with sessions() as session:
        images = await own_images(session, settings, tenant, *wanted)
    checked = check_experiment(body, settings, tenant, images)
    own = None
    if body.webhook is not None:
        own = await webhooks.own_webhook(
            sessions, settings, tenant, body.webhook.url, list(body.webhook.events), ("webhook",)
        )
    exp = models.Experiment(
        id=new_experiment_id(),
        tenant_id=tenant,
        name=body.name,
        status="running",
        spec={
            "arms": checked.arms,
            "scorer": checked.scorer,
            "attempts": body.attempts,
            "concurrency": body.concurrency,
            "infrastructure_retries": body.infrastructure_retries,
            **({"webhook": own.model_dump(mode="json")} if own else {}),
            # Written only when asked for: a spec without it reads the same in an older release.
            **({"rules": body.rules} if body.rules != "sandhive" else {}),
        },
        meta=body.metadata,
        created_at=utc_now(),
    )
    async with sessions.begin() as session:
        session.add(exp)
        await session.flush()
        await store_rows(session, exp.id, checked.rows)
        await session.execute(insert(Item), _items(exp.id, checked, body.attempts))
    try:
        await advance(sessions, redis, settings, exp.id)
    except (AppError, SQLAlchemyError, OSError) as exc:  # stored: the workers' chore starts it
        log.warning("could not start experiment %s yet: %r", exp.id, exc)
    return await get_experiment(sessions, tenant, exp.id)


def _items(experiment_id: str, checked: Checked, attempts: int) -> list[dict[str, Any]]:
    """Every row x arm x attempt, numbered in start order: attempt, then row, then arm."""
    now = utc_now()
    items: list[dict[str, Any]] = []
    for attempt in range(1, attempts + 1):
        for row in checked.rows:
            for arm in checked.arms:
                items.append(
                    {
                        "experiment_id": experiment_id,
                        "row_id": row["id"],
                        "arm": arm["name"],
                        "attempt": attempt,
                        "seq": len(items),
                        "status": "pending",
                        "detail": {},
                        "prompt_tokens": 0,
                        "completion_tokens": 0,
                        "steps": 0,
                        "seconds": 0.0,
                        "retries": 0,
                        "updated_at": now,
                    }
                )
    return items


async def find_experiment(
    session: AsyncSession, tenant: str, experiment_id: str, *, lock: bool = False
) -> models.Experiment:
    """The tenant's experiment; NotFound if missing or another tenant's (invariant 6)."""
    query = select(models.Experiment).where(
        models.Experiment.id == experiment_id, models.Experiment.tenant_id == tenant
    )
    found = await session.scalar(query.with_for_update() if lock else query)
    if found is None:
        raise NotFound(f"no experiment {experiment_id}")
    return found


async def get_experiment(sessions: Sessions, tenant: str, experiment_id: str) -> ExperimentOut:
    async with sessions() as session:
        exp = await find_experiment(session, tenant, experiment_id)
        (out,) = await experiment_outs(session, [exp])
        return out


async def list_experiments(
    sessions: Sessions,
    tenant: str,
    *,
    status: str | None = None,
    limit: int = DEFAULT_PAGE,
    cursor: str | None = None,
) -> ExperimentList:
    """Newest first, `limit` per page; `next_cursor` continues after the last one (the task
    list's paging: an opaque (created_at, id) key, so rows created meanwhile shift nothing)."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"limit must be between 1 and {MAX_PAGE}")
    exp = models.Experiment
    query = select(exp).where(exp.tenant_id == tenant)
    if status is not None:
        query = query.where(exp.status == status)
    if cursor is not None:
        created_at, experiment_id = decode_cursor(cursor)
        query = query.where(tuple_(exp.created_at, exp.id) < tuple_(created_at, experiment_id))
    query = query.order_by(exp.created_at.desc(), exp.id.desc()).limit(limit + 1)
    async with sessions() as session:
        found = list(await session.scalars(query))
        page = found[:limit]
        outs = await experiment_outs(session, page)
    more = len(found) > limit
    return ExperimentList(
        experiments=outs,
        next_cursor=encode_cursor(page[-1].created_at, page[-1].id) if more else None,
    )


async def list_items(sessions: Sessions, tenant: str, experiment_id: str) -> list[ItemOut]:
    """Every item, in start order."""
    async with sessions() as session:
        exp = await find_experiment(session, tenant, experiment_id)
        items = await session.scalars(
            select(Item).where(Item.experiment_id == exp.id).order_by(Item.seq)
        )
        return [item_out(item) for item in items]


def item_out(item: models.ExperimentItem) -> ItemOut:
    return ItemOut.model_validate({name: getattr(item, name) for name in ITEM_COLUMNS})


async def cancel_experiment(
    sessions: Sessions, redis: Redis, tenant: str, experiment_id: str
) -> ExperimentOut:
    """Cancel pending items and stop running ones (each then ends `cancelled` when the chore
    sees its task end); Conflict once the experiment has finished."""
    async with sessions.begin() as session:
        exp = await find_experiment(session, tenant, experiment_id, lock=True)
        if exp.status == "finished":
            raise Conflict(f"experiment {experiment_id} already finished")
        if exp.status == "running" and "regrade_ends" in exp.spec:  # its runs already ended
            raise Conflict(f"experiment {experiment_id} is being regraded; wait for it to end")
        first = exp.status != "cancelled"  # a second cancel changes and reports nothing
        exp.status = "cancelled"
        exp.finished_at = exp.finished_at or utc_now()
        dropped = await session.execute(
            update(Item)
            .where(Item.experiment_id == exp.id, Item.status == "pending")
            .values(status="cancelled", updated_at=utc_now())
            .returning(Item.seq, Item.row_id, Item.arm, Item.attempt)
        )
        ended = {"status": "cancelled", "score": None, "error_kind": None, "task_id": None}
        events = await record_experiment_events(
            session,
            exp.id,
            [
                *(
                    ("item.ended", {"row_id": row_id, "arm": arm, "attempt": attempt, **ended})
                    for _, row_id, arm, attempt in sorted(dropped)
                ),
                *([("experiment.cancelled", {})] if first else []),
            ],
        )
        if first:
            await experiment_finished(session, exp)
        running = list(
            await session.scalars(
                select(Item.task_id).where(Item.experiment_id == exp.id, Item.status == "running")
            )
        )
    await wake_followers(redis, experiment_id, events)
    for task_id in running:
        if task_id is None:
            continue
        try:
            await cancel.cancel_task(sessions, redis, tenant, task_id)
        except (Conflict, NotFound):
            pass  # ended meanwhile: the chore records how
    return await get_experiment(sessions, tenant, experiment_id)
