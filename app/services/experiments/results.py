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

from sqlalchemy import select

from app.db import models
from app.db.engine import Sessions
from app.domain.experiment_report import ItemLike, arm_result, compare
from app.domain.resolve import problem
from app.domain.rollout_groups import Member, groups_of
from app.errors import InvalidInput
from app.schemas.experiments import ResultsOut
from app.services.experiments.scoring import grading_of
from app.services.experiments.service import find_experiment

Item = models.ExperimentItem


async def get_results(
    sessions: Sessions, tenant: str, experiment_id: str, grading: int | None = None
) -> ResultsOut:
    """The results of the current scoring, or of an earlier one (`grading`, from 1: the
    items' archived scores, with their usage as it is); 422 for a grading there never was."""
    async with sessions() as session:
        exp = await find_experiment(session, tenant, experiment_id)
        items = list(
            await session.scalars(
                select(Item).where(Item.experiment_id == exp.id).order_by(Item.seq)
            )
        )
    current = grading_of(exp.spec)
    if grading is not None and not 1 <= grading <= current:
        msg = f"experiment {exp.id} has gradings 1 to {current}, not {grading}"
        raise InvalidInput(msg, details=[problem(("grading",), msg, "not_found")])
    chosen = current if grading is None else grading
    arms = [arm["name"] for arm in exp.spec["arms"]]
    attempts = int(exp.spec["attempts"])
    by_arm: dict[str, list[ItemLike]] = {arm: [] for arm in arms}
    members: list[Member] = []
    for item in items:
        graded = item if chosen == current else _archived(item, chosen)
        by_arm.setdefault(item.arm, []).append(graded)
        members.append(Member(item.row_id, item.arm, item.attempt, graded))
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


@dataclass(frozen=True)
class _Graded:
    """An item as an earlier grading left it: that grading's outcome, the item's usage."""

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


def _archived(item: models.ExperimentItem, grading: int) -> _Graded:
    found = next((g for g in item.gradings if g.get("grading") == grading), None)
    if found is None:  # archived by every regrade; a row without it is as it was then
        found = {"status": item.status, "score": item.score, "error_kind": item.error_kind}
    return _Graded(
        row_id=item.row_id,
        row=item.row,
        status=str(found.get("status")),
        score=found.get("score"),
        error_kind=found.get("error_kind"),
        task_id=item.task_id,
        prompt_tokens=item.prompt_tokens,
        completion_tokens=item.completion_tokens,
        steps=item.steps,
        seconds=item.seconds,
    )
