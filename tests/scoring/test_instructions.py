"""The instruction_following scorer: each checker at its edges, strict vs loose, row checks."""

from __future__ import annotations

import re
from typing import Any

import pytest

from app.scoring.instructions import (
    INSTRUCTION_IDS,
    InstructionFollowingScorer,
    check_instruction,
    count_sentences,
    loose_variants,
    score_instruction_following,
    validate_row,
)
from app.scoring.types import Scorer, ScorerError


def follows(instruction_id: str, kwargs: dict[str, Any] | None, text: str) -> bool:
    return check_instruction(instruction_id, kwargs, text)


def follows_loosely(instruction_id: str, kwargs: dict[str, Any] | None, text: str) -> bool:
    return check_instruction(instruction_id, kwargs, text, loose=True)


def test_at_least_a_dozen_instructions_are_offered() -> None:
    assert len(INSTRUCTION_IDS) >= 12
    assert all(":" in instruction_id for instruction_id in INSTRUCTION_IDS)


# Length: relations at their boundaries


WORDS = "one two three four five"


@pytest.mark.parametrize(
    ("relation", "target", "expected"),
    [
        ("at least", 5, True),
        ("at least", 6, False),
        ("at most", 5, True),
        ("at most", 4, False),
        ("less than", 5, False),
        ("less than", 6, True),
        ("more than", 4, True),
        ("more than", 5, False),
        ("exactly", 5, True),
        ("At Least", 5, True),
    ],
)
def test_number_words_relations_at_the_boundary(relation: str, target: int, expected: bool) -> None:
    kwargs = {"relation": relation, "num_words": target}
    assert follows("length_constraints:number_words", kwargs, WORDS) is expected


def test_words_are_runs_of_letters_and_digits() -> None:
    kwargs = {"relation": "exactly", "num_words": 4}
    assert follows("length_constraints:number_words", kwargs, "It's 42 -- ok.")


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("One. Two! Three?", 3),
        ("No terminal punctuation", 1),
        ("Dr. Smith met Mr. Jones. They talked.", 2),
        ("Pi is 3.14 today. See example.com now.", 2),
        ("Use tools, e.g. a shell. Then stop.", 2),
        ("J. K. Rowling wrote it. Really.", 2),
        ('He said "stop." Then left.', 2),
        ("Wait... what?! Yes.", 3),
        ("", 0),
        ("   ", 0),
    ],
)
def test_count_sentences(text: str, count: int) -> None:
    assert count_sentences(text) == count


def test_number_sentences_less_than_is_strict() -> None:
    text = "One. Two. Three."
    assert not follows(
        "length_constraints:number_sentences", {"relation": "less than", "num_sentences": 3}, text
    )
    assert follows(
        "length_constraints:number_sentences", {"relation": "at least", "num_sentences": 3}, text
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("First.\n***\nSecond.\n***\nThird.", True),
        ("First.\n***\nSecond.", False),
        ("***\nFirst.\n***\nSecond.\n***\nThird.\n***", True),  # outer dividers are ignored
        ("First.\n***\n\n***\nSecond.\n***\nThird.", False),  # an empty middle paragraph
        ("First.\n\nSecond.\n\nThird.", False),  # blank lines are not dividers here
    ],
)
def test_number_paragraphs_exact(text: str, expected: bool) -> None:
    kwargs = {"num_paragraphs": 3}
    assert follows("length_constraints:number_paragraphs", kwargs, text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Intro here.\n\nSummer is warm.\n\nThe end.", True),
        ('Intro here.\n\n"Summer, they say."\n\nThe end.', True),
        ("Intro here.\n\n**Summer** is warm.\n\nThe end.", False),
        ("Intro here.\n\nWinter is cold.\n\nThe end.", False),
        ("Intro here.\n\nSummer is warm.", False),  # two paragraphs, three asked
        ("Intro here.\n  \nSummer is warm.\n\n\n\nThe end.", True),  # blank lines of any size
    ],
)
def test_nth_paragraph_first_word(text: str, expected: bool) -> None:
    kwargs = {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "summer"}
    assert follows("length_constraints:nth_paragraph_first_word", kwargs, text) is expected


def test_nth_paragraph_beyond_the_paragraphs_is_not_followed() -> None:
    kwargs = {"num_paragraphs": 2, "nth_paragraph": 3, "first_word": "x"}
    assert not follows("length_constraints:nth_paragraph_first_word", kwargs, "a\n\nb")


# Keywords


def test_keywords_existence_is_case_insensitive_and_needs_all() -> None:
    kwargs = {"keywords": ["Sandbox", "agent"]}
    assert follows("keywords:existence", kwargs, "An AGENT in a sandbox.")
    assert not follows("keywords:existence", kwargs, "A sandbox alone.")


def test_keyword_frequency_counts_case_insensitively() -> None:
    text = "Cat, cat and CAT."
    assert follows(
        "keywords:frequency", {"keyword": "cat", "frequency": 3, "relation": "at least"}, text
    )
    assert not follows(
        "keywords:frequency", {"keyword": "cat", "frequency": 3, "relation": "less than"}, text
    )


def test_keyword_is_literal_not_a_pattern() -> None:
    kwargs = {"keyword": "a.b", "frequency": 1, "relation": "at least"}
    assert not follows("keywords:frequency", kwargs, "axb")
    assert follows("keywords:frequency", kwargs, "see a.b")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A clean answer.", True),
        ("This is Bad.", False),
        ("Badminton is fine.", True),  # whole words only
        ("bad-tempered", False),
    ],
)
def test_forbidden_words_are_whole_words(text: str, expected: bool) -> None:
    kwargs = {"forbidden_words": ["bad", "awful"]}
    assert follows("keywords:forbidden_words", kwargs, text) is expected


def test_letter_frequency_ignores_case() -> None:
    kwargs = {"letter": "Z", "let_frequency": 3, "let_relation": "at least"}
    assert follows("keywords:letter_frequency", kwargs, "Zig zag zoo")
    assert not follows("keywords:letter_frequency", kwargs, "Zig zag")


# Format


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1}',
        "  [1, 2, 3]  \n",
        '```json\n{"a": [1, 2]}\n```',
        '```JSON\n{"a": 1}\n```',
        '```\n{"a": 1}\n```',
    ],
)
def test_json_format_accepts_bare_and_fenced_json(text: str) -> None:
    assert follows("detectable_format:json_format", {}, text)


@pytest.mark.parametrize(
    "text",
    [
        "{'a': 1}",
        'Here you go: {"a": 1}',
        '```json\n{"a": 1}\n```\nHope this helps.',
        "```python\n{}\n```",
        "",
    ],
)
def test_json_format_refuses_anything_else(text: str) -> None:
    assert not follows("detectable_format:json_format", {}, text)


def test_json_after_a_preamble_passes_only_loosely() -> None:
    text = 'Sure, here it is:\n```json\n{"a": 1}\n```'
    assert not follows("detectable_format:json_format", {}, text)
    assert follows_loosely("detectable_format:json_format", {}, text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("* one\n* two\n* three", True),
        ("- one\n- two\n- three", True),
        ("* one\n- two\n  * three", True),  # mixed markers and nesting
        ("* one\n* two", False),
        ("* one\n* two\n* three\n* four", False),  # exactly, not at least
        ("**Title**\n* one\n* two\n* three", True),  # bold is not a bullet
        ("*one*\n* one\n* two\n* three", True),  # emphasis is not a bullet
        ("---\n- one\n- two\n- three\n* * *", True),  # rules are not bullets
        ("-5 degrees\n- one\n- two\n- three", True),
    ],
)
def test_number_bullet_lists(text: str, expected: bool) -> None:
    assert follows("detectable_format:number_bullet_lists", {"num_bullets": 3}, text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<<A poem of joy>>\nLine one.", True),
        ("Intro\n<<Title>> text", True),
        ("<<   >>\nNo title.", False),
        ("<<broken\ntitle>>", False),
        ("<Single>", False),
        ("No title at all.", False),
    ],
)
def test_title_in_double_angular_brackets(text: str, expected: bool) -> None:
    assert follows("detectable_format:title", {}, text) is expected


def test_highlighted_sections_count_single_and_double_stars() -> None:
    kwargs = {"num_highlights": 2}
    assert follows("detectable_format:number_highlighted_sections", kwargs, "*one* and **two**")
    assert not follows("detectable_format:number_highlighted_sections", kwargs, "*one* and ** **")


@pytest.mark.parametrize(
    ("text", "spliter", "expected"),
    [
        ("SECTION 1\nIntro.\nSECTION 2\nBody.", "SECTION", True),
        ("**SECTION 1**\nIntro.\n**SECTION 2**\nBody.", "SECTION", True),
        ("SECTION 1\nIntro.", "SECTION", False),
        ("Section 1\nIntro.\nSection 2\nBody.", "SECTION", False),  # the case is as asked
        ("Section 1\nIntro.\nSection 2\nBody.", "Section", True),
        ("SECTION X\nIntro.\nSECTION Y\nBody.", "SECTION", False),  # a number is required
        ("SUBSECTION 1\nSUBSECTION 2", "SECTION", False),
    ],
)
def test_multiple_sections(text: str, spliter: str, expected: bool) -> None:
    kwargs = {"section_spliter": spliter, "num_sections": 2}
    assert follows("detectable_format:multiple_sections", kwargs, text) is expected


def test_constrained_response() -> None:
    check = "detectable_format:constrained_response"
    assert follows(check, {}, "Thinking... My answer is maybe.")
    assert not follows(check, {}, "My answer is probably.")
    assert not follows(check, {}, "my answer is yes.")


# Content


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Dear [name], meet me at [address].", True),
        ("Dear [name], meet me.", False),
        ("Dear [name], meet me at [ ].", False),  # an empty placeholder does not count
        ("[a] [b] [c]", True),
    ],
)
def test_number_placeholders_at_least(text: str, expected: bool) -> None:
    kwargs = {"num_placeholders": 2}
    assert follows("detectable_content:number_placeholders", kwargs, text) is expected


@pytest.mark.parametrize(
    ("text", "marker", "expected"),
    [
        ("Body.\n\nP.S. Call me.", "P.S.", True),
        ("Body.\n\np.s. call me.", "P.S.", True),
        ("Body.\n\nP. S. Call me.", "P.S.", True),
        ("Body.\nP.P.S. Also this.", "P.P.S", True),
        ("Body without a postscript.", "P.S.", False),
        ("Body. PS call me.", "P.S.", False),
        ("Body.\nNote: the end.", "Note:", True),
    ],
)
def test_postscript(text: str, marker: str, expected: bool) -> None:
    kwargs = {"postscript_marker": marker}
    assert follows("detectable_content:postscript", kwargs, text) is expected


# Case, punctuation, start and end, combinations


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("all lowercase, with 3 numbers & punctuation!", True),
        ("one Capital", False),
        ("123 !!!", False),  # nothing cased at all
    ],
)
def test_english_lowercase(text: str, expected: bool) -> None:
    assert follows("change_case:english_lowercase", {}, text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("ALL CAPS, 2 NUMBERS!", True), ("ALL CAPS bUT ONE", False)],
)
def test_english_capital(text: str, expected: bool) -> None:
    assert follows("change_case:english_capital", {}, text) is expected


def test_capital_word_frequency() -> None:
    kwargs = {"capital_frequency": 2, "capital_relation": "less than"}
    assert follows("change_case:capital_word_frequency", kwargs, "ONE word in caps")
    assert not follows("change_case:capital_word_frequency", kwargs, "ONE TWO three")


def test_no_comma() -> None:
    assert follows("punctuation:no_comma", {}, "No commas here.")
    assert not follows("punctuation:no_comma", {}, "Well, no.")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Thanks. Is there anything else I can help with?", True),
        ("Thanks. Is there anything else I can help with?   \n\n", True),
        ("Thanks. IS THERE ANYTHING ELSE I CAN HELP WITH?", True),
        ("Thanks. Is there anything else I can help with? Bye.", False),
    ],
)
def test_end_checker_ignores_trailing_whitespace_and_case(text: str, expected: bool) -> None:
    kwargs = {"end_phrase": "Is there anything else I can help with?"}
    assert follows("startend:end_checker", kwargs, text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [('"Quoted answer."', True), ('  "Quoted."  \n', True), ('"', False), ("Not quoted.", False)],
)
def test_quotation(text: str, expected: bool) -> None:
    assert follows("startend:quotation", {}, text) is expected


def test_repeat_prompt_first() -> None:
    kwargs = {"prompt_to_repeat": "Write a haiku."}
    assert follows("combination:repeat_prompt", kwargs, "write a haiku. Leaves fall...")
    assert not follows("combination:repeat_prompt", kwargs, "Sure! Write a haiku.")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("First answer.\n******\nSecond answer.", True),
        ("Same.\n******\nSame.", False),
        ("Only one.", False),
        ("One.\n******\n\n******\nTwo.", False),
        ("******\nOne.\n******\nTwo.\n******", True),
    ],
)
def test_two_responses(text: str, expected: bool) -> None:
    assert follows("combination:two_responses", {}, text) is expected


# Strict and loose


def test_loose_variants_drop_first_last_both_lines_and_stars() -> None:
    variants = loose_variants("Sure:\n**body**\nBye")
    assert variants[:4] == ["Sure:\n**body**\nBye", "**body**\nBye", "Sure:\n**body**", "**body**"]
    assert "body" in variants
    assert len(variants) == len(set(variants)) == 8


@pytest.mark.parametrize(
    ("instruction_id", "kwargs", "text"),
    [
        ("startend:quotation", {}, 'Here is my answer:\n"Quoted."'),
        (
            "startend:end_checker",
            {"end_phrase": "The end."},
            "Story.\nThe end.\nHope you liked it!",
        ),
        ("change_case:english_lowercase", {}, "Sure! Here you go:\nall lowercase text"),
        ("punctuation:no_comma", {}, "Sure, here:\nno commas below"),
        (
            "length_constraints:nth_paragraph_first_word",
            {"num_paragraphs": 2, "nth_paragraph": 1, "first_word": "first"},
            "**First** point.\n\nSecond point.",
        ),
        ("startend:quotation", {}, '"**Bold** quote."*'),
    ],
)
def test_loose_accepts_after_the_usual_transformations(
    instruction_id: str, kwargs: dict[str, Any], text: str
) -> None:
    assert follows_loosely(instruction_id, kwargs, text)


@pytest.mark.parametrize(
    ("instruction_id", "kwargs", "text"),
    [
        ("startend:quotation", {}, 'Here is my answer:\n"Quoted."'),
        (
            "startend:end_checker",
            {"end_phrase": "The end."},
            "Story.\nThe end.\nHope you liked it!",
        ),
        ("change_case:english_lowercase", {}, "Sure! Here you go:\nall lowercase text"),
        ("punctuation:no_comma", {}, "Sure, here:\nno commas below"),
        (
            "length_constraints:nth_paragraph_first_word",
            {"num_paragraphs": 2, "nth_paragraph": 1, "first_word": "first"},
            "**First** point.\n\nSecond point.",
        ),
        ("startend:quotation", {}, '"**Bold** quote."*'),
    ],
)
def test_strict_refuses_what_loose_forgives(
    instruction_id: str, kwargs: dict[str, Any], text: str
) -> None:
    assert not follows(instruction_id, kwargs, text)


def test_loose_still_refuses_a_real_failure() -> None:
    assert not follows_loosely("punctuation:no_comma", {}, "a, b\nc, d\ne, f")


@pytest.mark.parametrize("loose", [False, True])
def test_an_empty_answer_follows_nothing(loose: bool) -> None:
    # Even instructions that an empty string satisfies vacuously (no comma, no forbidden word).
    assert not check_instruction("punctuation:no_comma", {}, "  \n ", loose=loose)


# Scoring rows


ROW = {
    "instruction_id_list": [
        "punctuation:no_comma",
        "length_constraints:number_words",
        "startend:end_checker",
    ],
    "kwargs": [{}, {"relation": "at least", "num_words": 100}, {"end_phrase": "Bye."}],
}


def test_score_is_the_fraction_followed_and_names_every_instruction() -> None:
    score = score_instruction_following("No commas here. Bye.", ROW)
    assert score.value == pytest.approx(2 / 3)
    assert score.detail["mode"] == "strict"
    assert score.detail["all_followed"] is False
    assert (score.detail["followed"], score.detail["total"]) == (2, 3)
    assert score.detail["instructions"] == [
        {"id": "punctuation:no_comma", "kwargs": {}, "followed": True},
        {
            "id": "length_constraints:number_words",
            "kwargs": {"relation": "at least", "num_words": 100},
            "followed": False,
        },
        {"id": "startend:end_checker", "kwargs": {"end_phrase": "Bye."}, "followed": True},
    ]


def test_all_followed_scores_one() -> None:
    score = score_instruction_following(" ".join(["word"] * 100) + " Bye.", ROW)
    assert score.value == 1.0
    assert score.detail["all_followed"] is True


def test_loose_row_scoring_reports_its_mode() -> None:
    row = {"instruction_id_list": ["startend:quotation"], "kwargs": [{}]}
    answer = 'Here it is:\n"Quoted."'
    assert score_instruction_following(answer, row).value == 0.0
    loose = score_instruction_following(answer, row, loose=True)
    assert loose.value == 1.0
    assert loose.detail["mode"] == "loose"


def test_no_answer_scores_zero() -> None:
    assert score_instruction_following(None, ROW).value == 0.0


def test_scorer_class_follows_the_protocol() -> None:
    scorer: Scorer = InstructionFollowingScorer(loose=True)
    assert scorer.kind == "instruction_following"
    assert scorer.needs_ground_truth is False
    row = {"instruction_id_list": ["startend:quotation"], "kwargs": [{}]}
    assert scorer.score('Here it is:\n"Quoted."', row).value == 1.0


def test_hugging_face_rows_with_null_kwargs_validate() -> None:
    row = {
        "instruction_id_list": ["detectable_format:title", "length_constraints:number_words"],
        "kwargs": [
            {"num_words": None, "relation": None},
            {"num_words": 300.0, "relation": "less than", "keywords": None},
        ],
    }
    validate_row(row)
    score = score_instruction_following("<<T>>\nShort.", row)
    assert score.detail["instructions"][1]["kwargs"] == {"num_words": 300, "relation": "less than"}


def test_null_kwargs_entries_and_missing_kwargs_mean_no_arguments() -> None:
    validate_row({"instruction_id_list": ["punctuation:no_comma"], "kwargs": [None]})
    validate_row({"instruction_id_list": ["punctuation:no_comma"]})


# Refusing bad rows up front


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({}, "instruction_id_list must be a non-empty list"),
        ({"instruction_id_list": []}, "instruction_id_list must be a non-empty list"),
        ({"instruction_id_list": "punctuation:no_comma"}, "non-empty list"),
        ({"instruction_id_list": ["nope:nothing"], "kwargs": [{}]}, "unknown instruction 'nope"),
        ({"instruction_id_list": [42], "kwargs": [{}]}, "unknown instruction 42"),
        ({"instruction_id_list": ["language:response_language"]}, "unknown instruction"),
        ({"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}, {}]}, "aligned"),
        ({"instruction_id_list": ["punctuation:no_comma"], "kwargs": {}}, "aligned"),
        ({"instruction_id_list": ["punctuation:no_comma"], "kwargs": ["x"]}, "must be an object"),
        (
            {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{"num_words": 3}]},
            "unknown kwargs num_words (allowed: none)",
        ),
        (
            {"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{}]},
            "missing kwargs num_words, relation",
        ),
    ],
)
def test_validate_row_refuses_bad_rows(row: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        validate_row(row)


@pytest.mark.parametrize(
    ("instruction_id", "kwargs", "message"),
    [
        ("length_constraints:number_words", {"relation": "about", "num_words": 3}, "one of"),
        ("length_constraints:number_words", {"relation": "at least", "num_words": -1}, ">= 0"),
        ("length_constraints:number_words", {"relation": "at least", "num_words": "3"}, ">= 0"),
        ("length_constraints:number_words", {"relation": "at least", "num_words": True}, ">= 0"),
        ("length_constraints:number_words", {"relation": "at least", "num_words": 2.5}, ">= 0"),
        ("length_constraints:number_paragraphs", {"num_paragraphs": 0}, ">= 1"),
        ("keywords:existence", {"keywords": []}, "non-empty list"),
        ("keywords:existence", {"keywords": "word"}, "non-empty list"),
        ("keywords:existence", {"keywords": ["ok", ""]}, r"keywords\[1\] must be a non-empty"),
        (
            "keywords:letter_frequency",
            {"letter": "ab", "let_frequency": 1, "let_relation": "at least"},
            "single letter",
        ),
        ("startend:end_checker", {"end_phrase": "   "}, "non-empty string"),
    ],
)
def test_bad_kwargs_name_the_instruction_and_argument(
    instruction_id: str, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        check_instruction(instruction_id, kwargs, "text")
    assert instruction_id in str(raised.value)


def test_the_error_names_the_position_of_the_bad_instruction() -> None:
    row = {"instruction_id_list": ["punctuation:no_comma", "bad:id"], "kwargs": [{}, {}]}
    with pytest.raises(ValueError, match=r"^instruction 1: unknown instruction 'bad:id'"):
        validate_row(row)


def test_scoring_a_bad_row_raises_scorer_error() -> None:
    with pytest.raises(ScorerError, match=r"instruction_following: .*unknown instruction"):
        score_instruction_following("text", {"instruction_id_list": ["bad:id"]})
