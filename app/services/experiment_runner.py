"""Advancing experiments: score the items whose task ended, start pending ones, finish.

Run by every worker as a chore (`advance_all`, every `experiment_tick_s`) and by the API
right after an experiment is created (`advance`), the same code either way. Each
experiment is advanced in one transaction holding its row (FOR UPDATE SKIP LOCKED), so two
workers never advance the same experiment at once: an item's task is created in the same
transaction that marks it running (never two tasks for one item), and an item is scored
only while `running`, so a re-run scores nothing twice. Tasks are enqueued after the
commit; if that fails, reconciliation enqueues the committed rows (invariant 1).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import exists, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.bus import queue
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.errors import InvalidInput, TooLarge, TooManyRequests
from app.ids import utc_now
from app.resolve import check_inputs, resolve_spec
from app.scoring.registry import scorer_for
from app.scoring.types import Scorer, ScorerError, score_answer
from app.services import backpressure
from app.services.experiment_input import arm_submission
from app.services.tasks import new_task, store_task
from app.states import TERMINAL, FinishReason, TaskStatus

log = logging.getLogger(__name__)
Item = models.ExperimentItem
SCORE_BATCH = 200
"""Items scored per experiment and transaction; the rest wait for the next tick."""
AGENT_REASONS = frozenset(
    {FinishReason.max_steps, FinishReason.context_limit, FinishReason.timeout}
)
"""Endings that are the agent's doing (its budget); the others are the infrastructure's."""


async def advance_all(sessions: Sessions, redis: Redis, settings: Settings) -> int:
    """Advance every experiment with work left; the number of tasks started."""
    exp = models.Experiment
    busy = exists().where(Item.experiment_id == exp.id, Item.status == "running")
    async with sessions() as session:
        ids = list(
            await session.scalars(
                select(exp.id).where(or_(exp.status == "running", busy)).order_by(exp.created_at)
            )
        )
    started = 0
    for experiment_id in ids:
        started += len(await advance(sessions, redis, settings, experiment_id))
    return started


async def advance(
    sessions: Sessions, redis: Redis, settings: Settings, experiment_id: str
) -> list[str]:
    """One step of one experiment; the ids of the tasks it started (none if another holds it)."""
    async with sessions.begin() as session:
        exp = await session.scalar(
            select(models.Experiment)
            .where(models.Experiment.id == experiment_id)
            .with_for_update(skip_locked=True)
        )
        if exp is None:
            return []
        await _score_ended(session, exp)
        started: list[str] = []
        if exp.status == "running":
            started = await _start_pending(session, settings, exp)
            await _finish_if_done(session, exp)
    for task_id in started:
        try:
            await queue.enqueue(redis, task_id)
        except (RedisError, OSError) as exc:
            log.warning("could not enqueue %s (reconciliation will): %r", task_id, exc)
    return started


# Scoring the items whose task ended


async def _score_ended(session: AsyncSession, exp: models.Experiment) -> None:
    task = models.Task
    query = (
        select(Item, task)
        .outerjoin(task, task.id == Item.task_id)
        .where(Item.experiment_id == exp.id, Item.status == "running")
        .where(or_(task.id.is_(None), task.status.in_(TERMINAL)))
        .order_by(Item.seq)
        .limit(SCORE_BATCH)
        .with_for_update(of=Item)
    )
    rows = list(await session.execute(query))
    if not rows:
        return
    scorer = scorer_for(exp.spec["scorer"])
    for item, ended in rows:
        record_end(item, ended, scorer)


def record_end(item: models.ExperimentItem, task: models.Task | None, scorer: Scorer) -> None:
    """The item's end from its task's: scored, cancelled or an error of some kind."""
    item.updated_at = utc_now()
    if task is None:
        _error(item, "infrastructure", "the item's task no longer exists")
        return
    _copy_usage(item, task)
    item.answer = task.answer
    reason = FinishReason(task.finish_reason) if task.finish_reason else None
    if task.status == TaskStatus.cancelled:
        item.status = "cancelled"
    elif task.status != TaskStatus.succeeded:
        kind = "agent" if reason in AGENT_REASONS else "infrastructure"
        _error(item, kind, task.error or f"the task ended with {reason}", reason=reason)
    elif task.answer is None:
        _error(item, "agent", "the agent gave no answer (no output/answer.txt)")
    else:
        _score(item, task.answer, scorer)


def _score(item: models.ExperimentItem, answer: str, scorer: Scorer) -> None:
    try:
        score = score_answer(scorer, answer, item.row)
    except ScorerError as exc:
        _error(item, "scorer", exc.message, **exc.detail)
        return
    item.status = "scored"
    item.score = score.value
    item.detail = _json_safe(score.detail)


def _error(item: models.ExperimentItem, kind: str, message: str, **detail: Any) -> None:
    item.status = "error"
    item.error_kind = kind
    item.detail = _json_safe({"message": message, **detail})


def _copy_usage(item: models.ExperimentItem, task: models.Task) -> None:
    usage: Mapping[str, Any] = task.usage or {}
    item.prompt_tokens = int(usage.get("prompt_tokens", 0))
    item.completion_tokens = int(usage.get("completion_tokens", 0))
    item.steps = int(usage.get("steps", 0))
    if task.started_at is not None and task.finished_at is not None:
        item.seconds = (task.finished_at - task.started_at).total_seconds()


def _json_safe(value: Any) -> Any:
    """What JSONB stores: strings without NUL, and anything else as its string."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return str(value)


# Starting pending items, at most `concurrency` running at once


async def _start_pending(
    session: AsyncSession, settings: Settings, exp: models.Experiment
) -> list[str]:
    running = await session.scalar(
        select(func.count())
        .select_from(Item)
        .where(Item.experiment_id == exp.id, Item.status == "running")
    )
    slots = int(exp.spec["concurrency"]) - int(running or 0)
    if slots <= 0:
        return []
    pending = await session.scalars(
        select(Item)
        .where(Item.experiment_id == exp.id, Item.status == "pending")
        .order_by(Item.seq)
        .limit(slots)
        .with_for_update()
    )
    arms = {arm["name"]: arm for arm in exp.spec["arms"]}
    started = []
    for item in list(pending):
        try:
            async with session.begin_nested():  # a refused start leaves the scores above
                started.append(await _start_item(session, settings, exp, arms[item.arm], item))
        except TooManyRequests:
            break  # the queue or the tenant is full: the next tick tries again
        except (InvalidInput, TooLarge, ValidationError) as exc:  # the server changed since
            _error(item, "infrastructure", f"the task was refused: {exc}")
            item.updated_at = utc_now()
    return started


async def _start_item(
    session: AsyncSession,
    settings: Settings,
    exp: models.Experiment,
    arm: Mapping[str, Any],
    item: models.ExperimentItem,
) -> str:
    """Create the item's task exactly as a submission does, and link it; its id."""
    metadata = {"experiment": exp.id, "row": item.row_id, "arm": item.arm, "attempt": item.attempt}
    body = arm_submission(arm, item.row["problem_statement"], item.row["input_files"], metadata)
    spec = resolve_spec(body, settings)
    files = check_inputs(body, settings)
    await backpressure.admit(session, settings, exp.tenant_id)
    task = await store_task(session, new_task(exp.tenant_id, body, spec), files)
    item.task_id = task.id
    item.status = "running"
    item.updated_at = utc_now()
    return task.id


async def _finish_if_done(session: AsyncSession, exp: models.Experiment) -> None:
    left = await session.scalar(
        select(func.count())
        .select_from(Item)
        .where(Item.experiment_id == exp.id, Item.status.in_(("pending", "running")))
    )
    if not left:
        exp.status = "finished"
        exp.finished_at = utc_now()
