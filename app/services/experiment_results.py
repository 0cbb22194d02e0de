"""An experiment's results: per arm mean, interval, pass@k, errors, usage and domains; and a
paired comparison for every pair of arms on the rows both scored.

Imported by the API. Computed from the items on each read (`app.scoring.stats`); nothing is
cached, so results of a running experiment are those of the items scored so far.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Sequence

from sqlalchemy import select

from app.db import models
from app.db.engine import Sessions
from app.experiment_schemas import (
    ArmResult,
    DomainResult,
    IntervalOut,
    PairOut,
    ResultsOut,
    Spread,
)
from app.scoring import stats
from app.services.experiments import find_experiment

Item = models.ExperimentItem


async def get_results(sessions: Sessions, tenant: str, experiment_id: str) -> ResultsOut:
    async with sessions() as session:
        exp = await find_experiment(session, tenant, experiment_id)
        items = list(
            await session.scalars(
                select(Item).where(Item.experiment_id == exp.id).order_by(Item.seq)
            )
        )
    arms = [arm["name"] for arm in exp.spec["arms"]]
    attempts = int(exp.spec["attempts"])
    by_arm: dict[str, list[models.ExperimentItem]] = {arm: [] for arm in arms}
    for item in items:
        by_arm.setdefault(item.arm, []).append(item)
    return ResultsOut(
        experiment_id=exp.id,
        status=exp.status,
        arms=[arm_result(arm, by_arm[arm], attempts) for arm in arms],
        pairs=[
            pair
            for a, b in itertools.combinations(arms, 2)
            if (pair := compare(a, by_arm[a], b, by_arm[b])) is not None
        ],
    )


def arm_result(arm: str, items: Sequence[models.ExperimentItem], attempts: int) -> ArmResult:
    scored = [item for item in items if item.status == "scored"]
    ran = [item for item in items if item.task_id is not None and item.status != "running"]
    errors = Counter(item.error_kind or "unknown" for item in items if item.status == "error")
    domains: dict[str, list[float]] = defaultdict(list)
    for item in scored:
        domain = item.row.get("domain")
        if isinstance(domain, str) and domain:
            domains[domain].append(_value(item))
    values = [_value(item) for item in scored]
    return ArmResult(
        arm=arm,
        n=len(values),
        mean=stats.mean(values) if values else None,
        ci95=interval(values) if values else None,
        pass_at_k=_pass_at_k(scored, attempts),
        errors=dict(sorted(errors.items())),
        cancelled=sum(item.status == "cancelled" for item in items),
        prompt_tokens=spread([item.prompt_tokens for item in ran]),
        completion_tokens=spread([item.completion_tokens for item in ran]),
        steps=spread([item.steps for item in ran]),
        seconds=spread([item.seconds for item in ran]),
        domains={
            name: DomainResult(n=len(scores), mean=stats.mean(scores), ci95=interval(scores))
            for name, scores in sorted(domains.items())
        },
    )


def _value(item: models.ExperimentItem) -> float:
    return float(item.score or 0.0)


def interval(values: Sequence[float]) -> IntervalOut:
    """Wilson for pass/fail scores, a percentile bootstrap for anything in between."""
    if all(value in (0.0, 1.0) for value in values):
        found = stats.wilson_interval(sum(value == 1.0 for value in values), len(values))
    else:
        found = stats.bootstrap_ci(values)
    return IntervalOut(low=found.low, high=found.high)


def spread(values: Sequence[float]) -> Spread:
    if not values:
        return Spread(median=0.0, total=0.0)
    return Spread(median=stats.median(values), total=math.fsum(values))


def _pass_at_k(scored: Sequence[models.ExperimentItem], attempts: int) -> dict[str, float] | None:
    """Over rows whose every attempt was scored; None with one attempt or no such row."""
    if attempts < 2:
        return None
    per_row = _per_row(scored)
    complete = [scores for scores in per_row.values() if len(scores) == attempts]
    if not complete:
        return None
    return {str(k): stats.mean_pass_at_k(complete, k) for k in range(1, attempts + 1)}


def _per_row(scored: Sequence[models.ExperimentItem]) -> dict[str, list[float]]:
    rows: dict[str, list[float]] = defaultdict(list)
    for item in scored:
        rows[item.row_id].append(_value(item))
    return rows


def compare(
    a: str,
    items_a: Sequence[models.ExperimentItem],
    b: str,
    items_b: Sequence[models.ExperimentItem],
) -> PairOut | None:
    """Arm a against arm b on the rows both scored (a row's score: its attempts' mean)."""
    rows_a = {row: stats.mean(s) for row, s in _per_row(_scored(items_a)).items()}
    rows_b = {row: stats.mean(s) for row, s in _per_row(_scored(items_b)).items()}
    if not rows_a.keys() & rows_b.keys():
        return None
    found = stats.paired_comparison(rows_a, rows_b)
    return PairOut(
        a=a,
        b=b,
        n=found.n,
        mean_a=found.mean_a,
        mean_b=found.mean_b,
        difference=found.difference,
        ci95=IntervalOut(low=found.interval.low, high=found.interval.high),
        wins=found.wins,
        ties=found.ties,
        losses=found.losses,
    )


def _scored(items: Sequence[models.ExperimentItem]) -> list[models.ExperimentItem]:
    return [item for item in items if item.status == "scored"]
