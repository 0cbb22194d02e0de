"""An experiment's report from its items: per arm mean, interval, pass@k, errors, usage and
domains; and a paired comparison of two arms on the rows both scored.

A leaf (wire models and `app.scoring.stats` only) over anything item-shaped (`ItemLike`),
so the service (`services.experiment_results`, items from Postgres) and
`sandhive experiment run --local` (items in memory) report with the same numbers.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from app.schemas.experiments import (
    ArmIntervalMethod,
    ArmResult,
    Coverage,
    DomainResult,
    IntervalOut,
    PairOut,
    Spread,
)
from app.scoring import stats


class ItemLike(Protocol):
    """What the report reads of an item."""

    @property
    def row_id(self) -> str: ...
    @property
    def row(self) -> Mapping[str, Any]: ...
    @property
    def status(self) -> str: ...
    @property
    def score(self) -> float | None: ...
    @property
    def error_kind(self) -> str | None: ...
    @property
    def task_id(self) -> str | None:
        """Set once the item ran (or started running)."""
        ...

    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def seconds(self) -> float: ...
    @property
    def retries(self) -> int:
        """Runs again after the service failed its task."""
        ...


def arm_result(arm: str, items: Sequence[ItemLike], attempts: int) -> ArmResult:
    """The arm's numbers. Attempts of one row are one cluster: `mean` is mean@k (rows weigh
    equally, whatever number of their attempts was scored) and `ci95` is over rows."""
    scored = _scored(items)
    ran = [item for item in items if item.task_id is not None and item.status != "running"]
    errors = Counter(item.error_kind or "unknown" for item in items if item.status == "error")
    per_row = _per_row(scored)
    row_means = [stats.mean(scores) for scores in per_row.values()]
    domain_of = {item.row_id: item.row.get("domain") for item in scored}
    domains: dict[str, list[list[float]]] = defaultdict(list)
    for row_id, scores in per_row.items():
        domain = domain_of[row_id]
        if isinstance(domain, str) and domain:
            domains[domain].append(scores)
    found = interval(row_means) if row_means else None
    return ArmResult(
        arm=arm,
        n=len(scored),
        rows=len(row_means),
        mean=stats.mean(row_means) if row_means else None,
        ci95=found[0] if found else None,
        ci95_method=found[1] if found else None,
        pass_at_k=_pass_at_k(scored, attempts),
        errors=dict(sorted(errors.items())),
        cancelled=sum(item.status == "cancelled" for item in items),
        prompt_tokens=spread([item.prompt_tokens for item in ran]),
        completion_tokens=spread([item.completion_tokens for item in ran]),
        steps=spread([item.steps for item in ran]),
        seconds=spread([item.seconds for item in ran]),
        domains={name: _domain(rows) for name, rows in sorted(domains.items())},
        coverage=coverage(items),
    )


def coverage(items: Sequence[ItemLike]) -> Coverage:
    """The arm's items by whether they have a score, and why not."""
    ended_error = [item for item in items if item.status == "error"]
    agent = sum(item.error_kind == "agent" for item in ended_error)
    return Coverage(
        items=len(items),
        scored=sum(item.status == "scored" for item in items),
        agent_errors=agent,
        not_scored=len(ended_error) - agent,
        unfinished=sum(item.status in UNFINISHED for item in items),
        cancelled=sum(item.status == "cancelled" for item in items),
        retried=sum(bool(item.retries) for item in items),
    )


UNFINISHED = frozenset({"pending", "running", "scoring"})


def _domain(rows: Sequence[Sequence[float]]) -> DomainResult:
    means = [stats.mean(scores) for scores in rows]
    return DomainResult(
        n=sum(map(len, rows)), rows=len(rows), mean=stats.mean(means), ci95=interval(means)[0]
    )


def _value(item: ItemLike) -> float:
    return float(item.score or 0.0)


def interval(values: Sequence[float]) -> tuple[IntervalOut, ArmIntervalMethod]:
    """Wilson when every value is 0 or 1 (rows all passed or all failed), else a percentile
    bootstrap; the values are per-row means, so rows are what is resampled."""
    if all(value in (0.0, 1.0) for value in values):
        found = stats.wilson_interval(sum(value == 1.0 for value in values), len(values))
        return IntervalOut(low=found.low, high=found.high), "wilson"
    found = stats.bootstrap_ci(values)
    return IntervalOut(low=found.low, high=found.high), "bootstrap"


def spread(values: Sequence[float]) -> Spread:
    if not values:
        return Spread(median=0.0, total=0.0)
    return Spread(median=stats.median(values), total=math.fsum(values))


def _pass_at_k(scored: Sequence[ItemLike], attempts: int) -> dict[str, float] | None:
    """Over rows whose every attempt was scored; None with one attempt or no such row."""
    if attempts < 2:
        return None
    per_row = _per_row(scored)
    complete = [scores for scores in per_row.values() if len(scores) == attempts]
    if not complete:
        return None
    return {str(k): stats.mean_pass_at_k(complete, k) for k in range(1, attempts + 1)}


def _per_row(scored: Sequence[ItemLike]) -> dict[str, list[float]]:
    rows: dict[str, list[float]] = defaultdict(list)
    for item in scored:
        rows[item.row_id].append(_value(item))
    return rows


def compare(
    a: str, items_a: Sequence[ItemLike], b: str, items_b: Sequence[ItemLike]
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
        ci95_method=found.interval_method,
        wins=found.wins,
        ties=found.ties,
        losses=found.losses,
        p_value=found.p_value,
        verdict=found.verdict,
        summary=pair_summary(a, b, found),
    )


def pair_summary(a: str, b: str, found: stats.PairedComparison) -> str:
    """What the verdict means for this run, in one sentence a reader can quote."""
    low, high = found.interval.low, found.interval.high
    rows = f"{found.n} row{'s' if found.n != 1 else ''}"
    if found.verdict == "a_higher":
        return f"{a} higher by {found.difference:.3f} [{low:.3f}, {high:.3f}] on {rows}"
    if found.verdict == "b_higher":
        return f"{b} higher by {-found.difference:.3f} [{-high:.3f}, {-low:.3f}] on {rows}"
    decided = found.wins + found.losses
    if found.verdict == "too_few_pairs":
        return (
            f"too few rows with a winner ({decided}; {stats.MIN_PAIRS} needed) "
            f"to tell {a} and {b} apart"
        )
    return f"cannot tell {a} and {b} apart on {rows}"


def _scored(items: Sequence[ItemLike]) -> list[ItemLike]:
    return [item for item in items if item.status == "scored"]
