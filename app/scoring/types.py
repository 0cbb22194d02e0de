"""What a scorer returns and raises, and the protocol every scorer follows.

A scorer either returns a `Score` or raises `ScorerError` (an item error of kind "scorer"):
it never hides a failure as a 0. A 0 means the answer was read and judged wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol


@dataclass(frozen=True)
class Score:
    """A value in [0, 1] and what was extracted and compared to reach it (JSON-safe)."""

    value: float
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int | float):
            raise TypeError(f"score value must be a number, not {type(self.value).__name__}")
        if not (math.isfinite(self.value) and 0.0 <= self.value <= 1.0):
            raise ValueError(f"score value must be in [0, 1], got {self.value!r}")
        object.__setattr__(self, "value", float(self.value))


class ScorerError(Exception):
    """The scorer could not judge the answer (bad ground truth, timeout, library failure)."""

    kind: ClassVar[str] = "scorer"

    def __init__(self, message: str, detail: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = dict(detail or {})


class ScoringFailed(ScorerError):
    """No verdict because the infrastructure failed every try (workers lost, Docker
    unreachable), not because the scorer could not judge: stored as an `infrastructure`
    error, which results leave out and exports flag, never a `scorer` one."""

    kind: ClassVar[str] = "infrastructure"


class JudgeUnavailable(ScorerError):
    """The judge's model could not be reached (no connection, a timeout, 429 or 5xx after
    the client's retries): the infrastructure's failure, not the answer's. An experiment's
    item is scored again later, within its `infrastructure_retries`; past them it is not
    scored (`infrastructure`), never a 0."""

    kind: ClassVar[str] = "infrastructure"


class Scorer(Protocol):
    """Scores one answer against one dataset row (`ground_truth` plus any extra fields)."""

    @property
    def kind(self) -> str: ...

    @property
    def needs_ground_truth(self) -> bool:
        """True if every row must carry a `ground_truth` (the API checks it up-front)."""
        ...

    def score(self, answer: str | None, row: Mapping[str, Any]) -> Score:
        """`answer` is None when the agent gave none. Raises only `ScorerError`."""
        ...


def is_deferred(scorer: Scorer) -> bool:
    """Whether `scorer` is too slow for the advancing transaction (`llm_judge`, `python`):
    its items wait in `scoring` for a worker's scoring loop, which runs it outside."""
    return bool(getattr(scorer, "deferred", False))


def from_task(scorer: Scorer) -> bool:
    """Whether `scorer` scores an item from its task's own record (`verifier`: the reward
    its sandbox gave), not from an answer: nothing to compute when the item ends."""
    return bool(getattr(scorer, "from_task", False))


def score_answer(scorer: Scorer, answer: str | None, row: Mapping[str, Any]) -> Score:
    """Run `scorer`, turning any unexpected exception into a `ScorerError` (never a 0)."""
    try:
        return scorer.score(answer, row)
    except ScorerError:
        raise
    except Exception as exc:
        raise ScorerError(
            f"scorer {scorer.kind!r} failed: {type(exc).__name__}: {exc}",
            {"exception": type(exc).__name__},
        ) from exc


def ground_truths(row: Mapping[str, Any], kind: str) -> list[str]:
    """The row's reference answers: a string, a number, or a non-empty list of them."""
    value = row.get("ground_truth")
    items = value if isinstance(value, list | tuple) else [value]
    if not items:
        raise ScorerError(f"scorer {kind!r} needs a ground_truth; the row's list is empty")
    references = [_reference(item, kind) for item in items]
    return references


def _reference(item: object, kind: str) -> str:
    if item is None:
        raise ScorerError(f"scorer {kind!r} needs a ground_truth; the row has none")
    if isinstance(item, bool) or not isinstance(item, str | int | float):
        raise ScorerError(
            f"scorer {kind!r}: ground_truth must be a string, a number or a list of them, "
            f"not {type(item).__name__}"
        )
    text = str(item).strip()
    if not text:
        raise ScorerError(f"scorer {kind!r} needs a ground_truth; the row's is empty")
    return text
