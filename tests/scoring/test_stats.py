"""Results statistics against hand-computed values."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from app.scoring.stats import (
    Interval,
    bootstrap_ci,
    mean,
    mean_at_k,
    mean_pass_at_k,
    median,
    paired_comparison,
    pass_at_k,
    wilson_interval,
)

# Means and medians


def test_mean_is_exact_for_repeated_small_scores() -> None:
    assert mean([0.1] * 10) == 0.1
    assert mean(iter([1, 0, 0, 1])) == 0.5


@pytest.mark.parametrize(("values", "expected"), [([3, 1, 2], 2), ([4, 1, 3, 2], 2.5), ([7], 7)])
def test_median(values: list[float], expected: float) -> None:
    assert median(values) == expected


@pytest.mark.parametrize("summary", [mean, median])
def test_empty_input_is_refused(summary: Callable[[list[float]], float]) -> None:
    with pytest.raises(ValueError, match="at least one value"):
        summary([])


# pass@k: 1 - C(n-c, k) / C(n, k)


@pytest.mark.parametrize(
    ("k", "expected"),
    [
        (1, 1 - 3 / 5),  # C(3,1)/C(5,1) = 3/5
        (2, 1 - 3 / 10),  # C(3,2)/C(5,2) = 3/10
        (3, 1 - 1 / 10),  # C(3,3)/C(5,3) = 1/10
        (4, 1.0),  # only 3 failures: any 4 attempts include a pass
        (5, 1.0),
    ],
)
def test_pass_at_k_for_five_attempts_two_passing(k: int, expected: float) -> None:
    assert pass_at_k(5, 2, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("n", "c"), [(4, 0), (4, 1), (6, 3), (7, 2)])
def test_pass_at_k_matches_enumerating_every_draw(n: int, c: int) -> None:
    outcomes = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        draws = list(itertools.combinations(outcomes, k))
        expected = sum(any(draw) for draw in draws) / len(draws)
        assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_exact_for_large_n() -> None:
    # C(199, 100) / C(200, 100) = 100/200; both binomials overflow a float.
    assert pass_at_k(200, 1, 100) == 0.5
    assert pass_at_k(2000, 0, 1000) == 0.0
    assert pass_at_k(2000, 2000, 1) == 1.0


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match=r"must be|needs"):
        pass_at_k(n, c, k)


def test_mean_pass_at_k_averages_rows() -> None:
    rows = [[1, 1, 0, 0, 0], [0, 0, 0, 0, 0]]
    assert mean_pass_at_k(rows, 1) == pytest.approx((0.4 + 0.0) / 2)
    assert mean_pass_at_k([[0.5, 0.2]], 1, threshold=0.5) == pytest.approx(0.5)


def test_mean_at_k_weighs_rows_equally() -> None:
    assert mean_at_k([[1, 0, 1, 1], [0, 0]]) == pytest.approx((0.75 + 0.0) / 2)
    assert mean_at_k([[0.3], [0.5]]) == pytest.approx(0.4)


# Wilson


@pytest.mark.parametrize(
    ("successes", "low", "high"),
    [
        # z²/n = 0.38416; at 0/n the upper bound is (z²/n) / (1 + z²/n) = 0.27754.
        (0, 0.0, 0.27754),
        (10, 0.72246, 1.0),
        # 0.5 ± 1.96·sqrt(0.025 + 0.009604) / 1.38416 = 0.5 ± 0.26341
        (5, 0.23659, 0.76341),
    ],
)
def test_wilson_interval_out_of_ten(successes: int, low: float, high: float) -> None:
    interval = wilson_interval(successes, 10)
    assert interval.low == pytest.approx(low, abs=5e-5)
    assert interval.high == pytest.approx(high, abs=5e-5)


def test_wilson_is_exactly_bounded_at_the_edges() -> None:
    assert wilson_interval(0, 10).low == 0.0
    assert wilson_interval(10, 10).high == 1.0


def test_wilson_narrows_with_more_trials() -> None:
    small, large = wilson_interval(5, 10), wilson_interval(500, 1000)
    assert large.high - large.low < small.high - small.low
    assert 0.5 in large


@pytest.mark.parametrize(("successes", "n", "z"), [(0, 0, 1.96), (11, 10, 1.96), (1, 10, 0.0)])
def test_wilson_refuses_bad_input(successes: int, n: int, z: float) -> None:
    with pytest.raises(ValueError, match=r"must be|needs"):
        wilson_interval(successes, n, z)


# Bootstrap


SCORES = [0.2, 0.9, 0.4, 1.0, 0.0, 0.7, 0.5, 0.8, 0.3, 0.6]


def test_bootstrap_is_deterministic_for_a_seed() -> None:
    assert bootstrap_ci(SCORES, seed=7) == bootstrap_ci(SCORES, seed=7)
    assert bootstrap_ci(SCORES, seed=7) != bootstrap_ci(SCORES, seed=8)


def test_bootstrap_interval_contains_the_mean_within_the_data() -> None:
    interval = bootstrap_ci(SCORES)
    assert mean(SCORES) in interval
    assert min(SCORES) < interval.low < interval.high < max(SCORES)


def test_bootstrap_of_a_half_proportion_is_near_the_normal_width() -> None:
    # 50 of 100: standard error 0.05, so roughly 0.40 .. 0.60.
    interval = bootstrap_ci([1.0] * 50 + [0.0] * 50)
    assert interval.low == pytest.approx(0.40, abs=0.02)
    assert interval.high == pytest.approx(0.60, abs=0.02)


def test_higher_confidence_gives_a_wider_bootstrap_interval() -> None:
    wide = bootstrap_ci(SCORES, confidence=0.99)
    narrow = bootstrap_ci(SCORES, confidence=0.5)
    assert wide.low <= narrow.low
    assert narrow.high <= wide.high


def test_bootstrap_of_equal_scores_is_a_point() -> None:
    assert bootstrap_ci([0.5]) == Interval(0.5, 0.5)
    assert bootstrap_ci([1.0, 1.0, 1.0]) == Interval(1.0, 1.0)


@pytest.mark.parametrize("kwargs", [{"iterations": 0}, {"confidence": 1.0}, {"confidence": 0.0}])
def test_bootstrap_refuses_bad_settings(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be"):
        bootstrap_ci(SCORES, **kwargs)


def test_bootstrap_refuses_no_values() -> None:
    with pytest.raises(ValueError, match="at least one value"):
        bootstrap_ci([])


# Paired comparison


def test_clear_difference_excludes_zero() -> None:
    rows = [f"r{i}" for i in range(20)]
    sandbox = {row: 1.0 for row in rows}
    vanilla = {row: 1.0 if i < 4 else 0.0 for i, row in enumerate(rows)}
    result = paired_comparison(sandbox, vanilla)
    assert result.n == 20
    assert (result.mean_a, result.mean_b) == (1.0, 0.2)
    assert result.difference == pytest.approx(0.8)
    assert (result.wins, result.ties, result.losses) == (16, 4, 0)
    assert result.interval.excludes_zero()
    assert result.difference in result.interval


def test_balanced_wins_and_losses_include_zero() -> None:
    a = {f"r{i}": float(i % 2) for i in range(20)}
    b = {f"r{i}": float((i + 1) % 2) for i in range(20)}
    result = paired_comparison(a, b)
    assert (result.wins, result.ties, result.losses) == (10, 0, 10)
    assert result.difference == 0.0
    assert not result.interval.excludes_zero()


def test_only_rows_scored_in_both_arms_count() -> None:
    a = {"x": 1.0, "y": 0.0, "only_a": 1.0}
    b = {"x": 0.5, "y": 0.0, "only_b": 0.0}
    result = paired_comparison(a, b)
    assert result.n == 2
    assert result.difference == pytest.approx(0.25)
    assert (result.wins, result.ties, result.losses) == (1, 1, 0)


def test_pairing_does_not_depend_on_insertion_order() -> None:
    a = {f"r{i}": (i % 3) / 2 for i in range(15)}
    b = {f"r{i}": (i % 5) / 4 for i in range(15)}
    reversed_a = dict(reversed(list(a.items())))
    assert paired_comparison(a, b) == paired_comparison(reversed_a, b)


def test_tie_tolerance_absorbs_small_differences() -> None:
    a = {"x": 0.55, "y": 0.9, "z": 0.1}
    b = {"x": 0.5, "y": 0.5, "z": 0.5}
    result = paired_comparison(a, b, tie_tolerance=0.1)
    assert (result.wins, result.ties, result.losses) == (1, 1, 1)


def test_paired_comparison_refuses_disjoint_arms() -> None:
    with pytest.raises(ValueError, match="both arms"):
        paired_comparison({"x": 1.0}, {"y": 1.0})


def test_paired_comparison_refuses_negative_tolerance() -> None:
    with pytest.raises(ValueError, match="tie_tolerance"):
        paired_comparison({"x": 1.0}, {"x": 1.0}, tie_tolerance=-0.1)
