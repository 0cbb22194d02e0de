"""Summary statistics for experiment results: means, intervals, pass@k, paired arms.

Pure Python (no I/O, no numpy), deterministic given a seed, so a report computed twice from
the same scores is the same report. Imported by the experiment services and the CLI; it
imports nothing from the application.

Which interval for which number:

- A proportion of 0/1 scores (accuracy, pass rate) gets the Wilson score interval. The
  textbook normal ("Wald") interval collapses to a zero-width interval at 0/n and n/n and
  undercovers near the edges, which is exactly where benchmark scores sit (AIME 0/30,
  an easy set at 30/30). Wilson stays inside [0, 1] and keeps its coverage there.
- A mean of scores in [0, 1] that are not all 0/1 (partial credit, instruction fractions,
  mean@k over repeats) gets a percentile bootstrap: it assumes no distribution and needs
  nothing but the scores, at the cost of being too narrow for tiny n and degenerate when
  every score is equal (use Wilson if the scores are 0/1).
- Repeated attempts of one row are not independent draws: intervals over an arm are taken
  over rows (each row's mean over its attempts), a cluster interval, not over attempts.
- Two arms scored on the same rows (sandbox vs vanilla) are compared row by row: the
  paired bootstrap resamples rows, not scores, so the row-to-row difficulty that both
  arms share cancels out and the interval on the difference is far tighter than two
  independent intervals would suggest. A bootstrap is only as good as its sample, so it is
  used from `BOOTSTRAP_MIN_PAIRS` rows on and only when the differences vary; below that,
  or when every row differs by the same amount, the interval is Hoeffding's, which needs
  nothing but the differences' bounds and is honest (wide) at any n. Beside it, an exact
  two-sided sign test gives a p-value that is right at small n (five rows all won: 0.0625).
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import Literal, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

DEFAULT_ITERATIONS = 2000
DEFAULT_CONFIDENCE = 0.95
Z95 = NormalDist().inv_cdf(0.975)
"""The normal quantile of a two-sided 95 % interval, exactly (1.959963...), as scipy uses."""
TIE_TOLERANCE = 1e-9
"""Paired differences this close to 0 are ties: float noise (0.1 + 0.2 - 0.3) is no win."""
BOOTSTRAP_MIN_PAIRS = 20
"""Fewer paired rows than this get Hoeffding's interval instead of a bootstrap."""
MIN_PAIRS = 8
"""Below this many rows with a winner no clear difference can be shown: a two-sided sign
test needs 6 (5 of 5 wins: p = 0.0625) and Hoeffding's interval, which small n gets, needs
8 rows all won to exclude 0; so the comparison says "too few pairs"."""

IntervalMethod = Literal["bootstrap", "hoeffding"]
Verdict = Literal["a_higher", "b_higher", "no_clear_difference", "too_few_pairs"]


@dataclass(frozen=True)
class Interval:
    """A closed interval [low, high], as reported for a confidence level."""

    low: float
    high: float

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int | float) and self.low <= value <= self.high

    def excludes_zero(self) -> bool:
        """True when the whole interval lies on one side of 0 (a clear difference)."""
        return self.low > 0.0 or self.high < 0.0


@dataclass(frozen=True)
class PairedComparison:
    """Arm a against arm b on the rows both scored; `difference` is mean(a - b)."""

    n: int
    mean_a: float
    mean_b: float
    difference: float
    interval: Interval
    interval_method: IntervalMethod
    wins: int
    ties: int
    losses: int
    p_value: float
    """Exact two-sided sign test of wins against losses (ties left out)."""

    @property
    def verdict(self) -> Verdict:
        """A clear difference needs both the sign test (p < 0.05) and the interval to say so."""
        if self.wins + self.losses < MIN_PAIRS:
            return "too_few_pairs"
        if self.p_value < 0.05 and self.interval.low > 0.0:
            return "a_higher"
        if self.p_value < 0.05 and self.interval.high < 0.0:
            return "b_higher"
        return "no_clear_difference"


def mean(values: Iterable[float]) -> float:
    """Arithmetic mean (`math.fsum`, so long runs of small scores do not drift)."""
    items = _nonempty(values, "mean")
    return math.fsum(items) / len(items)


def median(values: Iterable[float]) -> float:
    """Middle value (mean of the two middle values for an even count); for tokens and steps,
    whose long right tail makes the mean a poor summary."""
    items = sorted(_nonempty(values, "median"))
    middle = len(items) // 2
    if len(items) % 2:
        return items[middle]
    return (items[middle - 1] + items[middle]) / 2


def wilson_interval(successes: int, n: int, z: float = Z95) -> Interval:
    """Wilson score interval for `successes` out of `n` 0/1 trials (`Z95`: 95 %).

    Preferred over the normal interval for proportions near 0 or 1 (see the module
    docstring): at 0/10 it still says "up to about 28 %", not "exactly 0 %".
    """
    if n <= 0:
        raise ValueError(f"wilson_interval needs n >= 1, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be between 0 and n={n}, got {successes}")
    if z <= 0:
        raise ValueError(f"z must be positive, got {z}")
    p = successes / n
    z2 = z * z
    denominator = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denominator
    # The exact bounds at 0/n and n/n are 0 and 1; rounding must not push them past.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(low, high)


def bootstrap_ci(
    values: Iterable[float],
    *,
    iterations: int = DEFAULT_ITERATIONS,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Interval:
    """Percentile-bootstrap interval for the mean of `values` (scores in [0, 1]).

    Resamples the values with replacement `iterations` times with `random.Random(seed)`,
    so the same values and seed always give the same interval. Suited to means of
    bounded, non-binary scores, where no closed form fits (see the module docstring).
    """
    items = _nonempty(values, "bootstrap_ci")
    _check_resampling(iterations, confidence)
    rng = random.Random(seed)
    n = len(items)
    means = [math.fsum(rng.choices(items, k=n)) / n for _ in range(iterations)]
    return _percentile_interval(means, confidence)


def hoeffding_interval(
    values: Sequence[float], low: float, high: float, confidence: float = DEFAULT_CONFIDENCE
) -> Interval:
    """Hoeffding's interval for the mean of `values`, each known to lie in [low, high].

    mean ± (high - low) * sqrt(ln(2 / alpha) / (2 n)), clipped to [low, high]: it assumes
    nothing about the distribution, so it holds at n = 1 and when every value is equal,
    where a bootstrap collapses to a point. The price is width.
    """
    items = _nonempty(values, "hoeffding_interval")
    _check_resampling(1, confidence)
    if not all(low <= value <= high for value in items):
        raise ValueError(f"hoeffding_interval: every value must lie in [{low}, {high}]")
    centre = mean(items)
    half = (high - low) * math.sqrt(math.log(2 / (1 - confidence)) / (2 * len(items)))
    return Interval(max(low, centre - half), min(high, centre + half))


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test: the chance of a split at least this uneven if each row
    were a coin flip. Equals scipy's `binomtest(wins, wins + losses).pvalue`."""
    if wins < 0 or losses < 0:
        raise ValueError(f"wins and losses must be >= 0, got {wins} and {losses}")
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1))
    return min(1.0, float(Fraction(2 * tail, 2**n)))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from `n` attempts of which `c` passed (Chen et al. 2021).

    The probability that at least one of k attempts drawn without replacement from the n
    passes: 1 - C(n-c, k) / C(n, k). Computed on exact integers and rounded once, so it
    neither overflows nor loses precision for large n (the naive float form does both;
    Chen et al.'s running product is the float workaround for the same thing).
    """
    if n < 1:
        raise ValueError(f"pass_at_k needs n >= 1 attempts, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be between 0 and n={n}, got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and n={n}, got {k}")
    if n - c < k:
        return 1.0
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def mean_pass_at_k(attempts: Iterable[Sequence[float]], k: int, *, threshold: float = 1.0) -> float:
    """Mean over rows of pass@k, an attempt passing when its score is >= `threshold`."""
    rows = _nonempty(attempts, "mean_pass_at_k")
    return mean(pass_at_k(len(row), sum(s >= threshold for s in row), k) for row in rows)


def mean_at_k(attempts: Iterable[Sequence[float]]) -> float:
    """mean@k (avg@k): the mean over rows of each row's mean score over its k attempts.

    Rows weigh equally even if some have fewer attempts (a failed attempt should be
    scored 0, not dropped). With k = 1 this is the plain mean.
    """
    rows = _nonempty(attempts, "mean_at_k")
    return mean(mean(row) for row in rows)


def paired_comparison(
    a: Mapping[K, float],
    b: Mapping[K, float],
    *,
    iterations: int = DEFAULT_ITERATIONS,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
    tie_tolerance: float = TIE_TOLERANCE,
    bounds: tuple[float, float] = (0.0, 1.0),
) -> PairedComparison:
    """Compare arm `a` with arm `b` on the rows both scored (keys present in both).

    Reports mean(a - b) with an interval (a paired percentile bootstrap, rows resampled
    with their pairs, from `BOOTSTRAP_MIN_PAIRS` rows whose differences vary; Hoeffding's
    otherwise, from the scores' `bounds`), the count of rows where a scored higher (wins),
    within `tie_tolerance` (ties) or lower (losses), and the sign test's p-value. Rows are
    taken in sorted-key order so the result does not depend on the mappings' insertion
    order.
    """
    if tie_tolerance < 0:
        raise ValueError(f"tie_tolerance must be >= 0, got {tie_tolerance}")
    _check_resampling(iterations, confidence)
    common = sorted((key for key in a if key in b), key=repr)
    if not common:
        raise ValueError("paired_comparison needs at least one row scored in both arms")
    pairs = [(a[key], b[key]) for key in common]
    noise = min(tie_tolerance, TIE_TOLERANCE)  # float noise is 0 in the mean too
    differences = [0.0 if abs(x - y) <= noise else x - y for x, y in pairs]
    n = len(differences)
    method: IntervalMethod
    if n >= BOOTSTRAP_MIN_PAIRS and len(set(differences)) > 1:
        rng = random.Random(seed)
        means = [math.fsum(rng.choices(differences, k=n)) / n for _ in range(iterations)]
        found, method = _percentile_interval(means, confidence), "bootstrap"
    else:
        span = bounds[1] - bounds[0]
        found, method = hoeffding_interval(differences, -span, span, confidence), "hoeffding"
    wins = sum(d > tie_tolerance for d in differences)
    losses = sum(d < -tie_tolerance for d in differences)
    return PairedComparison(
        n=n,
        mean_a=mean(x for x, _ in pairs),
        mean_b=mean(y for _, y in pairs),
        difference=mean(differences),
        interval=found,
        interval_method=method,
        wins=wins,
        ties=n - wins - losses,
        losses=losses,
        p_value=sign_test(wins, losses),
    )


def _percentile_interval(samples: list[float], confidence: float) -> Interval:
    ordered = sorted(samples)
    tail = (1 - confidence) / 2
    return Interval(_quantile(ordered, tail), _quantile(ordered, 1 - tail))


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default "linear" method)."""
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    fraction = position - below
    return ordered[below] + (ordered[above] - ordered[below]) * fraction


def _check_resampling(iterations: int, confidence: float) -> None:
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence}")


def _nonempty(values: Iterable[T], what: str) -> list[T]:
    items = list(values)
    if not items:
        raise ValueError(f"{what} needs at least one value")
    return items
