"""`mcq`, `exact`, `contains`, `regex`, `f1` and `rouge_l` (`app.scoring.text`)."""

from __future__ import annotations

import json

import pytest

from app.scoring.text import (
    ContainsScorer,
    ExactScorer,
    F1Scorer,
    McqScorer,
    RegexScorer,
    RougeLScorer,
    squad_normalize,
)
from app.scoring.types import Score, ScorerError


def row(truth: object) -> dict[str, object]:
    return {"ground_truth": truth, "id": "q1", "domain": "chem"}


# mcq


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("C", "C"),
        ("c", "C"),
        ("C", "c"),
        ("Answer: (B)", "B"),
        ("answer: b", "(B)"),
        (r"Therefore \boxed{C}", "C"),
        ("After weighing the options, the answer is D.", "D"),
        ('{"answer": "A"}', "A"),
        ("Long reasoning about Both Compounds...\n\nB", "B"),
        ("<think>Answer: A</think>Answer: C", "C"),
        (r"\boxed{C} ... wait, Answer: D", "C"),  # the box wins over a later label
    ],
)
def test_mcq_reads_the_chosen_letter(answer: str, truth: str) -> None:
    assert McqScorer().score(answer, row(truth)).value == 1.0


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("Answer: (B)", "C"),
        ("Answer: Because of resonance", "B"),  # no letter chosen, the B is in a word
        ("I am not sure.", "I"),  # the pronoun is not choice I
        ("", "A"),
    ],
)
def test_mcq_wrong_or_missing_letters_score_zero(answer: str, truth: str) -> None:
    assert McqScorer().score(answer, row(truth)).value == 0.0


def test_mcq_detail_names_letter_and_rule() -> None:
    result = McqScorer().score("Final answer: (d)", row("D"))
    assert result.detail == {"extracted": "D", "rule": "answer_label", "ground_truth": "D"}


def test_mcq_choices_bound_what_counts() -> None:
    assert McqScorer(choices="ABCD").score("Answer: E", row("A")).detail["extracted"] is None
    with pytest.raises(ScorerError, match="names none of the choices"):
        McqScorer(choices="ABCD").score("A", row("E"))


@pytest.mark.parametrize("truth", [None, "", "the second one"])
def test_mcq_bad_ground_truth_is_a_scorer_error(truth: object) -> None:
    with pytest.raises(ScorerError):
        McqScorer().score("A", row(truth))


def test_mcq_no_answer_is_zero() -> None:
    assert McqScorer().score(None, row("A")).value == 0.0


# exact and contains


@pytest.mark.parametrize(
    ("scorer", "answer", "truth", "value"),
    [
        (ExactScorer(), "  Paris ", "paris", 1.0),
        (ExactScorer(), "New   York", "new york", 1.0),
        (ExactScorer(), "Paris.", "Paris", 0.0),
        (ExactScorer(squad=True), "The Paris.", "paris", 1.0),
        (ExactScorer(case_sensitive=True), "paris", "Paris", 0.0),
        (ExactScorer(), "Paris, France", "Paris", 0.0),
        (ExactScorer(), "42", 42, 1.0),
        (ExactScorer(), "Lyon", ["Paris", "Lyon"], 1.0),
        (ContainsScorer(), "The capital is Paris, of course.", "paris", 1.0),
        (ContainsScorer(), "It is 420.", "42", 0.0),  # whole words only
        (ContainsScorer(), "concatenate", "cat", 0.0),
        (ContainsScorer(), "costs $4.50 total", "$4.50", 1.0),
        (ContainsScorer(case_sensitive=True), "PARIS", "Paris", 0.0),
        (ContainsScorer(squad=True), "It's the U.S.A!", "usa", 1.0),
        (ContainsScorer(), "", "Paris", 0.0),
    ],
)
def test_exact_and_contains(
    scorer: ExactScorer | ContainsScorer, answer: str, truth: object, value: float
) -> None:
    assert scorer.score(answer, row(truth)).value == value


def test_exact_reads_after_reasoning() -> None:
    assert ExactScorer().score("<think>Lyon?</think>\nParis", row("Paris")).value == 1.0


@pytest.mark.parametrize("scorer", [ExactScorer(), ContainsScorer()])
def test_exact_and_contains_need_a_ground_truth(scorer: ExactScorer | ContainsScorer) -> None:
    with pytest.raises(ScorerError, match="needs a ground_truth"):
        scorer.score("x", {})


def test_a_ground_truth_empty_once_normalised_is_an_error() -> None:
    with pytest.raises(ScorerError, match="empty once normalised"):
        ContainsScorer(squad=True).score("the answer", row("The"))


# regex


def test_regex_fixed_pattern_needs_no_ground_truth() -> None:
    scorer = RegexScorer(pattern=r"\b(yes|no)\b", flags="i")
    assert scorer.needs_ground_truth is False
    result = scorer.score("I'd say YES, clearly", {})
    assert (result.value, result.detail["matched"]) == (1.0, "YES")
    assert scorer.score("maybe", {}).value == 0.0


def test_regex_fullmatch_must_cover_the_answer() -> None:
    assert RegexScorer(pattern=r"\d+", fullmatch=True).score(" 42 ", {}).value == 1.0
    assert RegexScorer(pattern=r"\d+", fullmatch=True).score("42 apples", {}).value == 0.0
    assert RegexScorer(pattern=r"\d+").score("42 apples", {}).value == 1.0


def test_regex_without_pattern_uses_each_rows_ground_truth() -> None:
    scorer = RegexScorer()
    assert scorer.needs_ground_truth is True
    assert scorer.score("the year 1969", row(r"19[67]\d")).value == 1.0
    assert scorer.score("the year 1989", row(r"19[67]\d")).value == 0.0
    with pytest.raises(ScorerError, match="invalid"):
        scorer.score("x", row("(unclosed"))
    with pytest.raises(ScorerError, match="needs a ground_truth"):
        scorer.score("x", {})


def test_regex_bad_pattern_or_flag_fails_at_construction() -> None:
    with pytest.raises(ValueError, match="invalid"):
        RegexScorer(pattern="[a-")
    with pytest.raises(ValueError, match="flags"):
        RegexScorer(pattern="a", flags="q")


# f1


def test_squad_normalize() -> None:
    assert squad_normalize("The  Cat, an apple & A dog!") == "cat apple dog"


@pytest.mark.parametrize(
    ("answer", "truth", "value"),
    [
        ("the cat sat", "The cat sat.", 1.0),
        ("cat sat on the mat", "cat sat", 2 * (2 / 4) * 1.0 / (2 / 4 + 1.0)),
        ("dog", "cat", 0.0),
        ("", "cat", 0.0),
        ("   ", "cat", 0.0),
        ("cat cat cat", "cat", 0.5),  # repeated tokens count once each side
        ("Lyon", ["Paris", "Lyon"], 1.0),
    ],
)
def test_f1(answer: str, truth: object, value: float) -> None:
    assert F1Scorer().score(answer, row(truth)).value == pytest.approx(value)


def test_f1_detail_and_no_answer() -> None:
    result = F1Scorer().score("cat sat on the mat", row("cat sat"))
    assert result.detail["precision"] == pytest.approx(0.5)
    assert result.detail["recall"] == pytest.approx(1.0)
    assert F1Scorer().score(None, row("cat")).value == 0.0


def test_f1_reference_without_tokens_is_an_error() -> None:
    with pytest.raises(ScorerError, match="no tokens"):
        F1Scorer().score("a", row("The!"))


# rouge_l


@pytest.mark.parametrize(
    ("answer", "truth", "value"),
    [
        ("the cat sat on the mat", "the cat sat on the mat", 1.0),
        ("the cat sat", "the cat sat on", 2 * 1.0 * 0.75 / 1.75),
        ("mat the on sat cat the", "the cat sat on the mat", 3 / 6),  # LCS "the on the"
        ("", "the cat", 0.0),
        ("completely different words", "the cat", 0.0),
        ("cats", ["dog", "cats"], 1.0),
    ],
)
def test_rouge_l(answer: str, truth: object, value: float) -> None:
    assert RougeLScorer().score(answer, row(truth)).value == pytest.approx(value)


def test_rouge_l_stemmer_option() -> None:
    assert RougeLScorer().score("running dogs", row("run dog")).value == 0.0
    assert RougeLScorer(use_stemmer=True).score("running dogs", row("run dog")).value == 1.0


def test_rouge_l_reference_it_cannot_tokenize_is_an_error() -> None:
    with pytest.raises(ScorerError, match="no tokens"):
        RougeLScorer().score("北京", row("北京"))


def test_rouge_l_no_answer_is_zero() -> None:
    assert RougeLScorer().score(None, row("the cat")).value == 0.0


@pytest.mark.parametrize(
    "scorer",
    [McqScorer(), ExactScorer(), ContainsScorer(), RegexScorer(), F1Scorer(), RougeLScorer()],
)
def test_every_detail_is_json(scorer: object) -> None:
    result = scorer.score("Answer: B", row("B"))  # type: ignore[attr-defined]
    assert isinstance(result, Score)
    json.dumps(result.detail)
