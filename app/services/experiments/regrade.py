"""Regrade: score an ended experiment's stored answers again with another scorer, no task run.

In one transaction holding the experiment's row: every item's current scoring is appended
to its `gradings` (`{grading, scorer, status, score, error_kind, detail}`), every item
whose run gave an answer the scorer judged or could not judge (`scored`, or `error` of
kind `scorer`) goes back to `scoring` under the new scorer, and the experiment becomes
`running` again with the new scorer current and the old one kept in its spec
(`earlier_scorers`). Items that never gave an answer (agent or infrastructure errors,
cancelled ones) keep their outcome in the new grading. The workers' scoring loop then
scores the answers, built-in scorers included, exactly as it scores a slow scorer's, and
the advancing chore ends the experiment when none is left: `finished`, or `cancelled`
again for an experiment that was cancelled (`regrade_ends`), since its cancelled items
are still cancelled. Refused (409) while any item is still pending, running or scoring.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from redis.asyncio import Redis
from sqlalchemy import and_, cast, func, or_, select, type_coerce, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.domain.resolve import Problem, problem
from app.errors import AppError, Conflict, InvalidInput
from app.ids import utc_now
from app.schemas.experiments import ExperimentOut
from app.scoring.types import Scorer, from_task
from app.services.experiments.events import record_experiment_events
from app.services.experiments.input import row_problems
from app.services.experiments.rows import ROW, with_rows
from app.services.experiments.runner import WORK_LEFT, advance
from app.services.experiments.scoring import (
    build_scorer,
    grading_of,
    scorer_problems,
    wake_followers,
)
from app.services.experiments.service import find_experiment, get_experiment

log = logging.getLogger(__name__)
Item = models.ExperimentItem


def check_scorer(spec: Mapping[str, Any], settings: Settings) -> Scorer:
    """The scorer of a spec, checked as `POST /v1/experiments` checks it (InvalidInput); one
    that scores answers (not a `verifier`)."""
    try:
        scorer = build_scorer(spec, settings)
    except ValueError as exc:
        raise InvalidInput(f"scorer: {exc}", details=[problem(("scorer",), str(exc))]) from exc
    _refuse("scorer", scorer_problems(scorer, settings))
    if from_task(scorer):  # its rewards were found in the items' sandboxes, which are gone
        msg = "a verifier's rewards come from the items' own sandboxes, which have ended"
        raise InvalidInput(f"scorer: {msg}", details=[problem(("scorer", "kind"), msg)])
    return scorer


async def _check_rows(session: AsyncSession, exp: models.Experiment, scorer: Scorer) -> None:
    """The stored rows have what the new scorer needs (a `ground_truth`, a row the scorer can
    read), as creation checks them for its scorer: else 422 naming the row."""
    first = (
        select(Item.row_id, func.min(Item.seq).label("seq"))
        .where(Item.experiment_id == exp.id)
        .group_by(Item.row_id)
        .subquery()
    )
    rows = await session.scalars(
        with_rows(select(ROW))
        .join(first, and_(Item.row_id == first.c.row_id, Item.seq == first.c.seq))
        .where(Item.experiment_id == exp.id)
        .order_by(first.c.seq)
    )
    _refuse("dataset", row_problems(list(rows), scorer))


def _refuse(what: str, problems: list[Problem]) -> None:
    if problems:
        summary = "; ".join(str(p["msg"]) for p in problems)
        raise InvalidInput(f"{what}: {summary}", details=problems)


async def regrade(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    tenant: str,
    experiment_id: str,
    spec: Mapping[str, Any],
) -> ExperimentOut:
    """Archive the current scoring and queue every judged answer for the new scorer."""
    built = check_scorer(spec, settings)
    scorer = dict(spec)
    async with sessions.begin() as session:
        exp = await find_experiment(session, tenant, experiment_id, lock=True)
        busy = await session.scalar(
            select(func.count())
            .select_from(Item)
            .where(Item.experiment_id == exp.id, Item.status.in_(WORK_LEFT))
        )
        if exp.status == "running" or busy:
            raise Conflict(f"experiment {experiment_id} is still running; regrade it once ended")
        await _check_rows(session, exp, built)
        old = dict(exp.spec)
        grading = grading_of(old)
        await session.execute(
            update(Item)
            .where(Item.experiment_id == exp.id)
            .values(gradings=Item.gradings.op("||")(_archive(grading, old["scorer"])))
            .execution_options(synchronize_session=False)
        )
        await session.execute(
            update(Item)
            .where(Item.experiment_id == exp.id, Item.answer.is_not(None), _judged())
            .values(
                status="scoring",
                score=None,
                error_kind=None,
                detail={},
                scoring_until=None,
                scoring_claims=0,
                updated_at=utc_now(),
            )
            .execution_options(synchronize_session=False)
        )
        exp.spec = {
            **old,
            "scorer": scorer,
            "earlier_scorers": [*old.get("earlier_scorers", []), old["scorer"]],
            "regrade_ends": exp.status,
        }
        exp.status = "running"
        exp.finished_at = None
        events = await record_experiment_events(
            session, exp.id, [("experiment.regrading", {"grading": grading + 1, "scorer": scorer})]
        )
    await wake_followers(redis, experiment_id, events)
    try:  # with nothing to score, this ends it at once; else the workers' chores do
        await advance(sessions, redis, settings, experiment_id)
    except (AppError, SQLAlchemyError, OSError) as exc:
        log.warning("could not advance experiment %s yet: %r", experiment_id, exc)
    return await get_experiment(sessions, tenant, experiment_id)


def _judged() -> Any:
    """Items whose answer a scorer saw or was to see: scored, a scorer's error, or not
    scored because the infrastructure failed every try (`stage: scoring`)."""
    unscored = and_(
        Item.status == "error",
        Item.error_kind == "infrastructure",
        Item.detail["stage"].astext == "scoring",
    )
    return or_(
        Item.status == "scored", and_(Item.status == "error", Item.error_kind == "scorer"), unscored
    )


def _archive(grading: int, scorer: Mapping[str, Any]) -> Any:
    """A one-element JSONB array: the item's current scoring, as grading `grading`."""
    entry = func.jsonb_build_object(
        "grading",
        grading,
        "scorer",
        cast(type_coerce(dict(scorer), JSONB), JSONB),
        "status",
        Item.status,
        "score",
        Item.score,
        "error_kind",
        Item.error_kind,
        "detail",
        Item.detail,
    )
    return func.jsonb_build_array(entry)
