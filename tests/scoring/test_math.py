"""The `math` scorer: equivalence by math-verify, a numeric fallback, errors never a 0."""

from __future__ import annotations

import json
import threading

import pytest

from app.scoring.math import MathScorer
from app.scoring.types import ScorerError

MATH = MathScorer()


def score(answer: str | None, truth: object, scorer: MathScorer = MATH) -> float:
    return scorer.score(answer, {"ground_truth": truth}).value


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        (r"so the result is $\boxed{\frac{1}{2}}$", "0.5"),
        (r"\boxed{\frac{1}{2}}", "1/2"),
        ("0.5", r"\boxed{\frac{1}{2}}"),
        ("1/2", r"\frac12"),
        (r"\boxed{\dfrac{3}{4}}", "0.75"),
        (r"\boxed{\tfrac{3}{4}}", r"\frac{3}{4}"),
        (r"\boxed{50\%}", "0.5"),
        (r"\boxed{50\%}", "50"),
        ("42 meters", "42"),
        (r"\boxed{42\text{ meters}}", "42"),
        ("The answer is 42 meters, as computed above.", "42"),
        ("x = 3", "3"),
        (r"\boxed{x = 3}", "3"),
        (r"\boxed{-3}", "-3"),
        ("\u22127", "-7"),  # Unicode minus
        (r"\boxed{1,000}", "1000"),
        (r"\boxed{2\sqrt{2}}", r"\sqrt{8}"),
        (r"\boxed{\frac{\sqrt{3}}{2}}", "0.8660254037844386"),
        (r"\boxed{\pi}", "3.14159265358979"),
        ("x^2+2x+1", "(x+1)^2"),
        (r"\boxed{[1,2)}", r"[1, 2)"),
        (r"\boxed{\{1,2\}}", r"\boxed{\{2,1\}}"),
        (r"\boxed{\boxed{7}}", "7"),
        (r"outer \boxed{\frac{1}{\sqrt{4}}} done", "1/2"),
        (r"first \boxed{3}, corrected: \boxed{5}", "5"),
        ("1e-3", "0.001"),
        ("42\n\nHope this helps!", "42"),
        ("<think>maybe \\boxed{9}</think>\\boxed{6}", "6"),
        (r"\boxed{6}", 6),  # a numeric ground truth from JSON
        (r"\boxed{6}", ["5", "6"]),  # any of several references
    ],
)
def test_equivalent_answers_score_one(answer: str, truth: object) -> None:
    assert score(answer, truth) == 1.0


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        (r"\boxed{-3}", "3"),
        (r"\boxed{\frac{1}{3}}", "0.33"),
        (r"\boxed{[1,2]}", r"[1,2)"),
        (r"\boxed{\{1,3\}}", r"\{1,2\}"),
        ("420", "42"),
        (r"\boxed{3} but the last box is \boxed{5}", "3"),  # only the last box counts
        (r"\boxed{}", "42"),
        ("", "42"),
        ("I could not solve it.", "42"),
        ("<think>so \\boxed{6}</think>no idea", "6"),  # reasoning is not the answer
        (r"\boxed{1000001}", "1000000"),  # integers get no tolerance
    ],
)
def test_different_answers_score_zero(answer: str, truth: str) -> None:
    assert score(answer, truth) == 0.0


def test_detail_says_what_was_read_and_how_it_matched() -> None:
    result = MATH.score(r"work \boxed{\frac{1}{2}}", {"ground_truth": "0.5"})
    assert result.detail["extracted"] == r"\frac{1}{2}"
    assert result.detail["source"] == "boxed"
    assert result.detail["parsed"] == "1/2"
    assert result.detail["gold_parsed"] == "1/2"
    assert result.detail["match"] == "math_verify"
    json.dumps(result.detail)  # stored as JSON


def test_no_box_falls_back_to_the_answer_phrase() -> None:
    result = MATH.score("The final answer is 12.", {"ground_truth": "12"})
    assert (result.value, result.detail["source"]) == (1.0, "answer_phrase")


def test_no_answer_scores_zero_but_still_checks_the_ground_truth() -> None:
    result = MATH.score(None, {"ground_truth": "3"})
    assert (result.value, result.detail["reason"]) == (0.0, "no answer")
    with pytest.raises(ScorerError, match="ground_truth"):
        MATH.score(None, {})


def test_tolerance_decides_near_values() -> None:
    truth = r"\frac{\sqrt{3}}{2}"
    assert score("0.866", truth) == 0.0
    assert score("0.866", truth, MathScorer(tolerance=1e-3)) == 1.0
    result = MATH.score(r"\boxed{1.0000001}", {"ground_truth": "1"})
    assert (result.value, result.detail["match"]) == (1.0, "tolerance")
    assert score(r"\boxed{1.0000001}", "1", MathScorer(tolerance=0.0)) == 0.0


def test_tolerance_is_relative_for_large_values() -> None:
    assert score("123456.789", "123456.7891") == 1.0
    assert score("123456.789", "123457.789") == 0.0


@pytest.mark.parametrize("row", [{}, {"ground_truth": None}, {"ground_truth": "  "}])
def test_missing_ground_truth_is_a_scorer_error(row: dict[str, object]) -> None:
    with pytest.raises(ScorerError) as caught:
        MATH.score(r"\boxed{1}", row)
    assert caught.value.kind == "scorer"


def test_an_unparseable_ground_truth_is_a_scorer_error_not_a_zero() -> None:
    with pytest.raises(ScorerError, match="could not be parsed"):
        MATH.score("1", {"ground_truth": "Hope this helps!"})


def test_a_runaway_comparison_times_out_as_a_scorer_error() -> None:
    with pytest.raises(ScorerError, match="timed out"):
        MathScorer(timeout_s=1).score(r"\boxed{9^{9^{9^{9}}}}", {"ground_truth": "1"})


def test_scoring_works_off_the_main_thread() -> None:
    """math-verify's SIGALRM bound only exists on the main thread; elsewhere it is off."""
    results: list[float] = []
    worker = threading.Thread(target=lambda: results.append(score(r"\boxed{\frac12}", "0.5")))
    worker.start()
    worker.join(timeout=30)
    assert results == [1.0]


@pytest.mark.parametrize("truth", [r"\boxed{\frac{1}{}", "Tuesday", r"\boxed{}"])
def test_a_ground_truth_that_is_not_mathematics_is_a_scorer_error(truth: str) -> None:
    with pytest.raises(ScorerError, match="could not be parsed"):
        MATH.score("1", {"ground_truth": truth})
