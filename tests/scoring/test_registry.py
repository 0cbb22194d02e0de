"""Scorers built from specs (`app.scoring.registry`) and the shared types."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import pytest

from app.scoring.math import MathScorer
from app.scoring.registry import scorer_for, scorer_kinds
from app.scoring.text import McqScorer, RegexScorer, RougeLScorer
from app.scoring.types import Score, ScorerError, score_answer

BUILT_IN = ["contains", "exact", "f1", "math", "mcq", "regex", "rouge_l"]


def test_known_kinds() -> None:
    kinds = scorer_kinds()
    assert set(BUILT_IN) <= set(kinds)
    assert kinds == sorted(kinds)


@pytest.mark.parametrize("kind", BUILT_IN)
def test_every_kind_builds_with_defaults_and_says_if_it_needs_ground_truth(kind: str) -> None:
    scorer = scorer_for({"kind": kind})
    assert scorer.kind == kind
    assert scorer.needs_ground_truth is True  # regex without a pattern uses the ground truth


def test_options_reach_the_scorer() -> None:
    assert scorer_for({"kind": "math", "tolerance": 1e-3, "timeout_s": 2}) == MathScorer(
        tolerance=1e-3, timeout_s=2
    )
    assert scorer_for({"kind": "mcq", "choices": "abcd"}) == McqScorer(choices="ABCD")
    assert scorer_for({"kind": "rouge_l", "use_stemmer": True}) == RougeLScorer(True)
    regex = scorer_for({"kind": "regex", "pattern": "^ok$", "flags": "im", "fullmatch": True})
    assert regex == RegexScorer(pattern="^ok$", flags="im", fullmatch=True)
    assert regex.needs_ground_truth is False


def test_a_built_scorer_scores() -> None:
    scorer = scorer_for({"kind": "math", "tolerance": 1e-6})
    assert scorer.score(r"\boxed{\frac{1}{2}}", {"ground_truth": "0.5"}).value == 1.0
    assert scorer_for({"kind": "mcq", "choices": "ABCD"}).score("(b)", {"ground_truth": "B"})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"kind": "judge"}, "unknown scorer kind 'judge'; known: contains, exact"),
        ({"kind": "llm_judge"}, "scorer 'llm_judge' needs a 'profile'"),
        ({"kind": "python"}, "option 'code' must be Python source"),
        ({}, "unknown scorer kind None"),
        ({"kind": 3}, "unknown scorer kind 3"),
        ({"kind": "regex", "pattern": "(unclosed"}, "pattern '(unclosed' is invalid"),
        ({"kind": "regex", "pattern": ""}, "pattern must be 1 to"),
        ({"kind": "regex", "pattern": 5}, "option 'pattern' must be a string"),
        ({"kind": "regex", "pattern": "a", "flags": "iq"}, "flags must be among"),
        ({"kind": "math", "tolerance": -1}, "option 'tolerance' must be between 0 and 0.5"),
        ({"kind": "math", "tolerance": math.nan}, "option 'tolerance' must be between"),
        ({"kind": "math", "tolerance": "1e-6"}, "option 'tolerance' must be a number"),
        ({"kind": "math", "tolerance": True}, "option 'tolerance' must be a number"),
        ({"kind": "math", "timeout_s": 0}, "option 'timeout_s' must be a whole number"),
        ({"kind": "math", "timeout_s": 1.5}, "option 'timeout_s' must be a whole number"),
        ({"kind": "math", "tolerence": 1e-6}, "scorer 'math' has no option(s) tolerence"),
        ({"kind": "mcq", "choices": "A"}, "choices must be 2 to 26 letters"),
        ({"kind": "mcq", "choices": "AB1"}, "choices must be 2 to 26 letters"),
        ({"kind": "mcq", "choices": "ÀB"}, "choices must be 2 to 26 letters"),
        ({"kind": "mcq", "choices": "ABA"}, "must not repeat"),
        ({"kind": "exact", "case_sensitive": "yes"}, "must be true or false"),
        ({"kind": "exact", "case_sensitive": True, "squad": True}, "cannot be case_sensitive"),
        ({"kind": "f1", "use_stemmer": True}, "scorer 'f1' has no option(s) use_stemmer"),
    ],
)
def test_bad_specs_are_refused_with_a_clear_message(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        scorer_for(spec)


def test_a_spec_must_be_a_mapping() -> None:
    with pytest.raises(ValueError, match="must be an object"):
        scorer_for(["math"])  # type: ignore[arg-type]


# types


@pytest.mark.parametrize("value", [-0.01, 1.01, math.nan, math.inf])
def test_a_score_stays_in_the_unit_interval(value: float) -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Score(value)


def test_a_score_is_a_float() -> None:
    assert Score(1).value == 1.0
    assert isinstance(Score(1).value, float)
    with pytest.raises(TypeError):
        Score(True)


class _Broken:
    kind = "broken"
    needs_ground_truth = True

    def score(self, answer: str | None, row: Mapping[str, Any]) -> Score:
        raise ZeroDivisionError("oops")


def test_score_answer_turns_a_crash_into_a_scorer_error_not_a_zero() -> None:
    with pytest.raises(ScorerError, match="scorer 'broken' failed: ZeroDivisionError: oops") as e:
        score_answer(_Broken(), "x", {})
    assert e.value.kind == "scorer"
    assert e.value.detail == {"exception": "ZeroDivisionError"}


def test_score_answer_passes_scores_and_scorer_errors_through() -> None:
    assert score_answer(scorer_for({"kind": "exact"}), "a b", {"ground_truth": "A  B"}).value == 1
    with pytest.raises(ScorerError, match="needs a ground_truth"):
        score_answer(scorer_for({"kind": "exact"}), "x", {"ground_truth": None})


@pytest.mark.parametrize(
    ("truth", "message"),
    [
        ([], "list is empty"),
        ({"a": 1}, "must be a string, a number or a list of them, not dict"),
        (True, "not bool"),
        (["ok", None], "has none"),
    ],
)
def test_malformed_ground_truths_are_scorer_errors(truth: object, message: str) -> None:
    with pytest.raises(ScorerError, match=re.escape(message)):
        scorer_for({"kind": "exact"}).score("x", {"ground_truth": truth})


def test_instruction_following_is_registered_strict_by_default_and_loose_on_request() -> None:
    row = {"instruction_id_list": ["change_case:english_lowercase"], "kwargs": [{}]}
    answer = "Title\nall lowercase here"
    strict = scorer_for({"kind": "instruction_following"})
    loose = scorer_for({"kind": "instruction_following", "loose": True})
    assert strict.kind == "instruction_following"
    assert strict.needs_ground_truth is False
    assert strict.score(answer, row).value == 0.0
    assert loose.score(answer, row).value == 1.0  # the loose reading drops the first line
    assert "instruction_following" in scorer_kinds()
