"""An experiment's results: per arm mean, interval, pass@k, errors, usage and domains; and a
paired comparison for every pair of arms on the rows both scored.

Imported by the API. Computed from the items on each read (`app.domain.experiment_report`, shared
with `sandhive experiment run --local`); nothing is cached, so results of a running
experiment are those of the items scored so far.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, null, select

from app.db import models
from app.db.engine import Sessions
from app.domain.experiment_report import ItemLike, arm_result, compare
from app.domain.resolve import problem
from app.domain.rollout_groups import Member, groups_of
from app.errors import InvalidInput
from app.schemas.experiments import ResultsOut
from app.services.experiments.rows import ROW_VALUE, with_rows
from app.services.experiments.scoring import grading_of
from app.services.experiments.service import find_experiment

Item = models.ExperimentItem


async def get_results(
    sessions: Sessions, tenant: str, experiment_id: str, grading: int | None = None
) -> ResultsOut:
    """The results of the current scoring, or of an earlier one (`grading`, from 1: the
    items' archived scores, with their usage as it is); 422 for a grading there never was.

    Reads a compact projection of each item (its outcome, usage and the row's `domain`),
    never its row, answer or detail: a call's memory grows by about 3 KiB per item (the
    report's own groups), whatever the rows and answers weigh (bench/results_memory.py)."""
    async with sessions() as session:
        exp = await find_experiment(session, tenant, experiment_id)
        current = grading_of(exp.spec)
        if grading is not None and not 1 <= grading <= current:
            msg = f"experiment {exp.id} has gradings 1 to {current}, not {grading}"
            raise InvalidInput(msg, details=[problem(("grading",), msg, "not_found")])
        chosen = current if grading is None else grading
        columns = [*PROJECTED, Item.gradings if chosen != current else null().label("gradings")]
        rows = (
            await session.execute(
                with_rows(select(*columns)).where(Item.experiment_id == exp.id).order_by(Item.seq)
            )
        ).all()
    arms = [arm["name"] for arm in exp.spec["arms"]]
    attempts = int(exp.spec["attempts"])
    by_arm: dict[str, list[ItemLike]] = {arm: [] for arm in arms}
    members: list[Member] = []
    for row in rows:
        graded = _graded(row, None if chosen == current else chosen)
        by_arm.setdefault(row.arm, []).append(graded)
        members.append(Member(row.row_id, row.arm, row.attempt, graded))
    return ResultsOut(
        experiment_id=exp.id,
        status=exp.status,
        grading=chosen,
        arms=[arm_result(arm, by_arm[arm], attempts) for arm in arms],
        pairs=[
            pair
            for a, b in itertools.combinations(arms, 2)
            if (pair := compare(a, by_arm[a], b, by_arm[b])) is not None
        ],
        groups=groups_of(members),
    )


PROJECTED = (
    Item.row_id,
    Item.arm,
    Item.attempt,
    Item.status,
    Item.score,
    Item.error_kind,
    Item.task_id,
    Item.prompt_tokens,
    Item.completion_tokens,
    Item.steps,
    Item.seconds,
    Item.retries,
    ROW_VALUE["domain"].label("domain"),
)
"""What the report reads of an item: its outcome, its usage, its row's `domain`."""


@dataclass(frozen=True)
class _Graded:
    """An item as a grading left it: that grading's outcome, the item's usage."""

    row_id: str
    row: Mapping[str, Any]
    status: str
    score: float | None
    error_kind: str | None
    task_id: str | None
    prompt_tokens: int
    completion_tokens: int
    steps: int
    seconds: float
    retries: int


def _graded(row: Row[Any], grading: int | None) -> _Graded:
    """The item's current outcome, or the archived one of `grading`."""
    found: Mapping[str, Any] = {
        "status": row.status,
        "score": row.score,
        "error_kind": row.error_kind,
    }
    if grading is not None:  # archived by every regrade; a row without it is as it was then
        archived = next((g for g in row.gradings or [] if g.get("grading") == grading), None)
        found = archived or found
    return _Graded(
        row_id=row.row_id,
        row={"domain": row.domain},
        status=str(found.get("status")),
        score=found.get("score"),
        error_kind=found.get("error_kind"),
        task_id=row.task_id,
        prompt_tokens=row.prompt_tokens or 0,
        completion_tokens=row.completion_tokens or 0,
        steps=row.steps or 0,
        seconds=row.seconds or 0.0,
        retries=row.retries or 0,
    )
