"""Intervals and p-values at small n, against scipy's computation of the same thing.

Each case is one a researcher meets with a small dataset: one row, every row tied, every
row differing by the same amount, float noise, rows missing from one arm, two attempts per
row, and an arm whose rows repeat (attempts are not independent draws).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest
from scipy import stats as scipy_stats

from app.domain.experiment_report import arm_result, compare
from app.scoring.stats import (
    BOOTSTRAP_MIN_PAIRS,
    hoeffding_interval,
    paired_comparison,
    sign_test,
    wilson_interval,
)


def scipy_wilson(successes: int, n: int) -> tuple[float, float]:
    found = scipy_stats.binomtest(successes, n).proportion_ci(method="wilson")
    return found.low, found.high


def scipy_sign_test(wins: int, losses: int) -> float:
    return 1.0 if wins + losses == 0 else scipy_stats.binomtest(wins, wins + losses).pvalue


@pytest.mark.parametrize(("successes", "n"), [(0, 1), (1, 1), (0, 5), (5, 5), (3, 7), (15, 30)])
def test_wilson_is_scipys(successes: int, n: int) -> None:
    found = wilson_interval(successes, n)
    assert (found.low, found.high) == pytest.approx(scipy_wilson(successes, n), abs=1e-12)


@pytest.mark.parametrize(
    ("wins", "losses"), [(0, 0), (1, 0), (5, 0), (6, 0), (3, 3), (11, 2), (0, 9), (40, 25)]
)
def test_the_sign_test_is_scipys_binomial_test(wins: int, losses: int) -> None:
    assert sign_test(wins, losses) == pytest.approx(scipy_sign_test(wins, losses), rel=1e-12)


def test_five_rows_all_won_is_not_certainty() -> None:
    """The issue's case: a bootstrap said [1, 1]; a sign test says p = 0.0625."""
    a = {f"r{i}": 1.0 for i in range(5)}
    b = {f"r{i}": 0.0 for i in range(5)}
    found = paired_comparison(a, b)
    assert found.p_value == pytest.approx(0.0625)
    assert found.interval_method == "hoeffding"
    assert found.interval.low < 0.5
    assert found.interval.high == 1.0
    assert found.verdict == "too_few_pairs"


def test_one_row() -> None:
    found = paired_comparison({"x": 1.0}, {"x": 0.0})
    assert (found.n, found.wins, found.p_value) == (1, 1, 1.0)
    assert (found.interval.low, found.interval.high) == (-1.0, 1.0)
    assert found.verdict == "too_few_pairs"


def test_all_ties() -> None:
    rows = {f"r{i}": i % 2 / 1 for i in range(30)}
    found = paired_comparison(rows, dict(rows))
    assert (found.wins, found.ties, found.losses, found.p_value) == (0, 30, 0, 1.0)
    assert found.interval_method == "hoeffding", "no spread: a bootstrap would be a point"
    assert found.interval.low < 0.0 < found.interval.high
    assert found.verdict == "too_few_pairs"


def test_every_row_differing_by_the_same_amount_gets_no_zero_width_interval() -> None:
    a = {f"r{i}": 0.75 for i in range(40)}
    b = {f"r{i}": 0.5 for i in range(40)}
    found = paired_comparison(a, b)
    assert found.interval_method == "hoeffding"
    expected = hoeffding_interval([0.25] * 40, -1.0, 1.0)
    assert found.interval == expected
    assert expected.high - expected.low > 0.5
    assert found.p_value == pytest.approx(scipy_sign_test(40, 0))
    assert found.verdict == "no_clear_difference", "p is tiny, but the interval holds 0"


def test_float_noise_is_a_tie_not_a_win() -> None:
    a = {f"r{i}": 0.1 + 0.2 for i in range(8)}
    b = {f"r{i}": 0.3 for i in range(8)}
    assert a["r0"] - b["r0"] == pytest.approx(5.55e-17, rel=0.01)
    found = paired_comparison(a, b)
    assert (found.wins, found.ties, found.losses) == (0, 8, 0)
    assert found.difference == 0.0


def test_a_clear_difference_needs_the_test_and_the_interval() -> None:
    a = {f"r{i}": 1.0 if i % 10 else 0.0 for i in range(60)}
    b = {f"r{i}": 0.0 if i % 3 else 1.0 for i in range(60)}
    found = paired_comparison(a, b)
    assert found.n >= BOOTSTRAP_MIN_PAIRS
    assert found.interval_method == "bootstrap"
    wins, losses = found.wins, found.losses
    assert found.p_value == pytest.approx(scipy_sign_test(wins, losses))
    assert found.p_value < 0.05
    assert found.interval.low > 0
    assert found.verdict == "a_higher"
    assert paired_comparison(b, a).verdict == "b_higher"


@dataclass
class Item:
    row_id: str
    score: float | None
    status: str = "scored"
    error_kind: str | None = None
    task_id: str | None = "tsk"
    row: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    steps: int = 0
    seconds: float = 0.0
    retries: int = 0


def test_repeated_attempts_are_one_cluster() -> None:
    """30 rows x 8 attempts, half the rows always right: 15 of 30 rows, not 120 of 240."""
    items = [Item(f"r{r}", float(r < 15)) for r in range(30) for _ in range(8)]
    arm = arm_result("a", items, attempts=8)
    assert (arm.n, arm.rows, arm.mean, arm.ci95_method) == (240, 30, 0.5, "wilson")
    assert arm.ci95 is not None
    assert (arm.ci95.low, arm.ci95.high) == pytest.approx(scipy_wilson(15, 30), abs=1e-12)
    assert arm.ci95.low == pytest.approx(0.332, abs=5e-4)


def test_the_mean_is_mean_at_k_when_attempts_errored() -> None:
    """Row x: 1 of 1 scored attempt right; row y: 0 of 3: mean@k is 1/2, not 1/4."""
    items = [Item("x", 1.0), Item("x", None, status="error", error_kind="agent")]
    items += [Item("y", 0.0) for _ in range(3)]
    arm = arm_result("a", items, attempts=3)
    assert (arm.n, arm.rows, arm.mean) == (4, 2, 0.5)
    assert arm.errors == {"agent": 1}


def test_coverage_sorts_every_item_by_why_it_has_or_lacks_a_score() -> None:
    """An infrastructure or scorer error is not scored (out of the mean, never a 0); the
    five counts add up to the arm's items."""
    items = [
        Item("a", 1.0),
        Item("b", 0.0, retries=1),
        Item("c", None, status="error", error_kind="agent"),
        Item("d", None, status="error", error_kind="infrastructure", retries=1),
        Item("e", None, status="error", error_kind="scorer"),
        Item("f", None, status="running"),
        Item("g", None, status="scoring"),
        Item("h", None, status="pending", task_id=None),
        Item("i", None, status="cancelled"),
    ]
    arm = arm_result("a", items, attempts=1)
    found = arm.coverage
    assert (found.items, found.scored, found.agent_errors, found.not_scored) == (9, 2, 1, 2)
    assert (found.unfinished, found.cancelled, found.retried) == (3, 1, 2)
    parts = found.scored + found.agent_errors + found.not_scored + found.unfinished
    assert parts + found.cancelled == found.items
    assert (arm.n, arm.mean) == (2, 0.5), "the errors are not zeros in the mean"


def test_two_attempts_per_row_and_missing_pairs() -> None:
    a = [Item(r, s) for r, s in [("p", 1.0), ("p", 0.0), ("q", 1.0), ("q", 1.0), ("only_a", 1.0)]]
    b = [Item(r, s) for r, s in [("p", 0.0), ("p", 0.0), ("q", 1.0), ("q", 0.0), ("only_b", 0.0)]]
    pair = compare("a", a, "b", b)
    assert pair is not None
    assert (pair.n, pair.difference, pair.wins, pair.ties, pair.losses) == (2, 0.5, 2, 0, 0)
    assert pair.p_value == pytest.approx(scipy_sign_test(2, 0))
    assert pair.ci95_method == "hoeffding"
    assert pair.verdict == "too_few_pairs"
    half = 2 * math.sqrt(math.log(40) / 4)
    assert pair.ci95.low == max(-1.0, 0.5 - half)
    assert pair.ci95.high == 1.0


def test_seven_rows_all_won_are_too_few_and_eight_are_enough() -> None:
    """The threshold is where a clear verdict becomes possible at all: 7 wins pass the sign
    test (p = 0.016) but Hoeffding's interval still holds 0; 8 wins exclude it."""
    seven = paired_comparison({f"r{i}": 1.0 for i in range(7)}, {f"r{i}": 0.0 for i in range(7)})
    assert seven.p_value < 0.05
    assert seven.interval.low < 0.0
    assert seven.verdict == "too_few_pairs"
    eight = paired_comparison({f"r{i}": 1.0 for i in range(8)}, {f"r{i}": 0.0 for i in range(8)})
    assert eight.interval.low > 0.0
    assert eight.verdict == "a_higher"


def test_hoeffding_refuses_values_outside_its_bounds() -> None:
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        hoeffding_interval([0.5, 1.5], 0, 1)


def test_each_pair_says_in_words_what_its_interval_means() -> None:
    higher = [Item(f"r{i}", 1.0) for i in range(10)]
    lower = [Item(f"r{i}", 0.0 if i < 9 else 1.0) for i in range(10)]
    won = compare("sandbox", higher, "vanilla", lower)
    assert won is not None
    assert won.verdict == "a_higher"
    low, high = won.ci95.low, won.ci95.high
    assert won.summary == f"sandbox higher by 0.900 [{low:.3f}, {high:.3f}] on 10 rows"
    lost = compare("vanilla", lower, "sandbox", higher)
    assert lost is not None
    assert lost.verdict == "b_higher"
    assert lost.summary == f"sandbox higher by 0.900 [{low:.3f}, {high:.3f}] on 10 rows"
    few = compare("a", higher[:6], "b", lower[:6])
    assert few is not None
    assert few.summary == "too few rows with a winner (6; 8 needed) to tell a and b apart"
    even = [Item(f"r{i}", float(i % 2)) for i in range(20)]
    odd = [Item(f"r{i}", float(1 - i % 2)) for i in range(20)]
    unclear = compare("a", even, "b", odd)
    assert unclear is not None
    assert unclear.verdict == "no_clear_difference"
    assert unclear.summary == "cannot tell a and b apart on 20 rows"
