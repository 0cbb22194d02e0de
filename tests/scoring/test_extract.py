"""Final answers and choice letters read out of free text (`app.scoring.extract`)."""

from __future__ import annotations

import pytest

from app.scoring.extract import choice_letter, final_answer, last_boxed, strip_reasoning


@pytest.mark.parametrize(
    ("text", "content"),
    [
        (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}"),
        (r"first \boxed{1}, then \boxed{2}", "2"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces do not close the box
        (r"\boxed{a \boxed{b} c}", r"a \boxed{b} c"),  # the box that closes last, whole
        (r"\boxed{\boxed{3}}", "3"),  # a box of nothing but a box is unwrapped
        (r"\fbox{7}", "7"),
        (r"$\boxed 5$", "5"),
        (r"\boxed{1} and a truncated \boxed{\frac{1", "1"),
        (r"\boxed{}", ""),
        (r"\boxed {x^{2}}", "x^{2}"),
    ],
)
def test_last_boxed_keeps_nested_braces(text: str, content: str) -> None:
    assert last_boxed(text) == content


@pytest.mark.parametrize("text", ["no box here", r"\boxed{never closed", r"\boxedx{1}", ""])
def test_last_boxed_finds_none(text: str) -> None:
    assert last_boxed(text) is None


@pytest.mark.parametrize(
    ("text", "value", "source"),
    [
        (r"thus \boxed{42}. The answer is 7", "42", "boxed"),
        ("The answer is 42 meters.", "42 meters", "answer_phrase"),
        ("**Final Answer:** **-3**.", "-3", "answer_phrase"),
        ("Final answer:\n\n  7\n", "7", "answer_phrase"),
        ("answer: 1 then later the answer is 2.", "2", "answer_phrase"),
        ("work...\nx = 3\n\n", "x = 3", "last_line"),
        ("3.5.", "3.5", "last_line"),
        ("   \n ", "", "empty"),
    ],
)
def test_final_answer_falls_back_from_box_to_phrase_to_last_line(
    text: str, value: str, source: str
) -> None:
    found = final_answer(text)
    assert (found.text, found.source) == (value, source)


def test_strip_reasoning_keeps_what_follows_the_last_think() -> None:
    assert strip_reasoning("<think>maybe A</think>ok</think> B") == " B"
    assert strip_reasoning("no reasoning: C") == "no reasoning: C"


@pytest.mark.parametrize(
    ("text", "letter", "rule"),
    [
        ("C", "C", "lone"),
        ("  (c)  ", "C", "lone"),
        ("**B.**", "B", "lone"),
        ("[d]", "D", "lone"),
        (r"so \boxed{C}", "C", "boxed"),
        (r"\boxed{\text{(b)}}", "B", "boxed"),
        (r"\boxed{C) 42 kJ/mol}", "C", "boxed"),
        ('{"answer": "d", "why": "..."}', "D", "json"),
        ("Answer: (B)", "B", "answer_label"),
        ("answer: c", "C", "answer_label"),
        ("**Answer:** D", "D", "answer_label"),
        ("Final Answer: option A", "A", "answer_label"),
        ("Answer: A ... on reflection, Answer: C", "C", "answer_label"),
        ("The correct answer is (d).", "D", "answer_phrase"),
        ("the answer is C because of the rate law", "C", "answer_phrase"),
        ("So the answer would be option b", "B", "answer_phrase"),
        ("I choose B", "B", "answer_phrase"),
        ("A is correct, the others are not", "A", "is_correct"),
        ("Option D is the best fit.", "D", "is_correct"),
        ("the reasoning goes on\n\nc", "C", "last_line"),
        ("Between A and B, I think C fits.", "C", "last_capital"),
        ("Because Both Cases Differ, pick (B) here", "B", "last_capital"),
    ],
)
def test_choice_letter_fallbacks(text: str, letter: str, rule: str) -> None:
    found = choice_letter(text)
    assert found is not None
    assert (found.letter, found.rule) == (letter, rule)


@pytest.mark.parametrize(
    "text",
    [
        "Answer: Because of the reaction",  # B of "Because" is inside a word
        "the answer is a reaction that releases heat",  # the article, not choice A
        "I think so",  # the pronoun, not choice I
        "Anything but Both",
        "",
    ],
)
def test_choice_letter_ignores_letters_inside_words(text: str) -> None:
    assert choice_letter(text) is None


def test_choice_letter_only_takes_configured_choices() -> None:
    assert choice_letter("Answer: E", "ABCD") is None
    found = choice_letter("Answer: E", "ABCDE")
    assert found is not None
    assert found.letter == "E"
    assert choice_letter("I choose J") is not None  # default choices are A to J
    assert choice_letter("I choose K") is None


def test_an_explicit_rule_beats_a_later_stray_capital() -> None:
    found = choice_letter("Answer: B\n\nNote: D was tempting, see Table C.")
    assert found is not None
    assert (found.letter, found.rule) == ("B", "answer_label")
