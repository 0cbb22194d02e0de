"""The `instruction_following` scorer: verifiable instructions checked by code, IFEval-style.

A row names its instructions (`instruction_id_list`, IFEval ids such as
`length_constraints:number_words`) and their arguments (`kwargs`, a list aligned with it,
e.g. `{"relation": "at least", "num_words": 100}`); the score is the fraction of
instructions the answer follows. Strict checks the answer as it is; loose also accepts it
after IFEval's transformations (first line, last line or both removed; `*` removed), which
forgive a preamble ("Sure, here it is:") or Markdown emphasis. Pure (no I/O); imported by
the scorer registry, and by the API through `validate_row` to refuse bad rows up front.

Semantics follow the IFEval paper's descriptions so scores are comparable with published
numbers, with three deliberate differences: a bullet needs a space after its `*` or `-`
(so `*emphasis*` and `---` rules are not bullets), a placeholder needs text inside its
brackets, and the case checks do not detect the response's language. IFEval's
`language:response_language` is not offered (it needs a language detector).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from app.scoring.types import Score, ScorerError

Kwargs = Mapping[str, Any]
Check = Callable[[str, Kwargs], bool]

RELATIONS: dict[str, Callable[[int, int], bool]] = {
    "less than": lambda count, target: count < target,
    "at most": lambda count, target: count <= target,
    "exactly": lambda count, target: count == target,
    "at least": lambda count, target: count >= target,
    "more than": lambda count, target: count > target,
}
CONSTRAINED_RESPONSES = ("My answer is yes.", "My answer is no.", "My answer is maybe.")
TWO_RESPONSES_SEPARATOR = "******"

_WORD = re.compile(r"\w+")
_QUOTES = "\"'\u2018\u2019\u201c\u201d"  # straight and curly quotation marks
_SENTENCE_END = re.compile(rf"[.!?]+[{_QUOTES})\]]*(?=\s|\Z)")
_TRAILING_TOKEN = re.compile(r"[\w.]+\Z")
_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "e.g", "i.e", "inc", "ltd", "co"}
)
_PARAGRAPH_DIVIDER = re.compile(r"\s?\*\*\*\s?")
_BLANK_LINE = re.compile(r"\n\s*\n")
_PLACEHOLDER = re.compile(r"\[[^\[\]\n]*[^\s\[\]][^\[\]\n]*\]")
_BULLET = re.compile(r"[ \t]*[*-][ \t]+\S.*")
_RULE = re.compile(r"[ \t]*(?:[*-][ \t]*){3,}")
_DOUBLE_HIGHLIGHT = re.compile(r"\*\*([^\n*]+)\*\*")
_SINGLE_HIGHLIGHT = re.compile(r"(?<!\*)\*([^\n*]+)\*(?!\*)")
_JSON_FENCE = re.compile(r"\A```(?:json)?[ \t]*\n?(.*?)\n?```\Z", re.DOTALL | re.IGNORECASE)
_TITLE = re.compile(r"<<([^\n]+?)>>")
_FIRST_WORD_STOP = re.compile(rf"[.,?!;:{_QUOTES}]")


def _compare(count: int, relation: str, target: int) -> bool:
    return RELATIONS[relation](count, target)


# Keywords


def _keywords_exist(text: str, kw: Kwargs) -> bool:
    lowered = text.lower()
    return all(keyword.lower() in lowered for keyword in kw["keywords"])


def _keyword_frequency(text: str, kw: Kwargs) -> bool:
    count = len(re.findall(re.escape(kw["keyword"]), text, re.IGNORECASE))
    return _compare(count, kw["relation"], kw["frequency"])


def _no_forbidden_words(text: str, kw: Kwargs) -> bool:
    return not any(
        re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text, re.IGNORECASE)
        for word in kw["forbidden_words"]
    )


def _letter_frequency(text: str, kw: Kwargs) -> bool:
    return _compare(text.lower().count(kw["letter"]), kw["let_relation"], kw["let_frequency"])


# Length


def _number_words(text: str, kw: Kwargs) -> bool:
    return _compare(len(_WORD.findall(text)), kw["relation"], kw["num_words"])


def count_sentences(text: str) -> int:
    """Sentences end in `.`, `!` or `?` before whitespace or the end; `Dr.`, `e.g.` and
    initials (`J. Smith`) do not end one, nor does a dot inside a number or a URL."""
    count, start = 0, 0
    for end in _SENTENCE_END.finditer(text):
        if end.group().startswith(".") and _ends_in_abbreviation(text[start : end.start()], end):
            continue
        count += _WORD.search(text[start : end.end()]) is not None
        start = end.end()
    return count + (_WORD.search(text[start:]) is not None)


def _ends_in_abbreviation(before: str, end: re.Match[str]) -> bool:
    if end.group().rstrip(_QUOTES + ")]") != ".":
        return False
    token = _TRAILING_TOKEN.search(before)
    if token is None:
        return False
    word = token.group()
    return word.lower() in _ABBREVIATIONS or (len(word) == 1 and word.isupper())


def _number_sentences(text: str, kw: Kwargs) -> bool:
    return _compare(count_sentences(text), kw["relation"], kw["num_sentences"])


def _number_paragraphs(text: str, kw: Kwargs) -> bool:
    """Paragraphs are separated by the Markdown divider `***`; exactly the number asked."""
    paragraphs = [part.strip() for part in _PARAGRAPH_DIVIDER.split(text)]
    if paragraphs and not paragraphs[0]:
        paragraphs.pop(0)
    if paragraphs and not paragraphs[-1]:
        paragraphs.pop()
    expected: int = kw["num_paragraphs"]
    return all(paragraphs) and len(paragraphs) == expected


def _nth_paragraph_first_word(text: str, kw: Kwargs) -> bool:
    """Paragraphs are separated by blank lines; exactly `num_paragraphs` of them, and the
    `nth_paragraph` (1-based) starts with `first_word`, ignoring case and punctuation."""
    paragraphs = [part for part in _BLANK_LINE.split(text) if part.strip()]
    nth = kw["nth_paragraph"]
    if len(paragraphs) != kw["num_paragraphs"] or nth > len(paragraphs):
        return False
    first_word: str = kw["first_word"]
    return _first_word(paragraphs[nth - 1]) == first_word.strip().lower()


def _first_word(paragraph: str) -> str:
    word = paragraph.split()[0].lstrip(_QUOTES)
    stop = _FIRST_WORD_STOP.search(word)
    return (word[: stop.start()] if stop else word).lower()


# Content and format


def _number_placeholders(text: str, kw: Kwargs) -> bool:
    minimum: int = kw["num_placeholders"]
    return len(_PLACEHOLDER.findall(text)) >= minimum


def _postscript(text: str, kw: Kwargs) -> bool:
    """The marker (`P.S.`, `P.P.S`) appears as a word, a space allowed after each dot."""
    marker = re.escape(kw["postscript_marker"].lower()).replace(r"\.", r"\.\s?")
    return re.search(rf"(?<!\w){marker}", text.lower()) is not None


def _number_bullets(text: str, kw: Kwargs) -> bool:
    """Exactly `num_bullets` Markdown bullet lines (`* item` or `- item`)."""
    bullets = [
        line for line in text.splitlines() if _BULLET.fullmatch(line) and not _RULE.fullmatch(line)
    ]
    expected: int = kw["num_bullets"]
    return len(bullets) == expected


def _constrained_response(text: str, kw: Kwargs) -> bool:
    return any(option in text for option in CONSTRAINED_RESPONSES)


def _number_highlights(text: str, kw: Kwargs) -> bool:
    """At least `num_highlights` non-empty `*highlighted*` or `**highlighted**` spans."""
    spans = [*_DOUBLE_HIGHLIGHT.findall(text), *_SINGLE_HIGHLIGHT.findall(text)]
    minimum: int = kw["num_highlights"]
    return sum(1 for span in spans if span.strip()) >= minimum


def _multiple_sections(text: str, kw: Kwargs) -> bool:
    """At least `num_sections` headers `<section_spliter> <number>` (case as given)."""
    header = rf"(?<!\w){re.escape(kw['section_spliter'])}[ \t]*\d+"
    minimum: int = kw["num_sections"]
    return len(re.findall(header, text)) >= minimum


def _json_format(text: str, kw: Kwargs) -> bool:
    """The whole answer parses as JSON, optionally inside one ```json fence."""
    body = text.strip()
    fenced = _JSON_FENCE.match(body)
    try:
        json.loads(fenced.group(1) if fenced else body)
    except (ValueError, RecursionError):
        return False
    return True


def _title(text: str, kw: Kwargs) -> bool:
    return any(title.strip() for title in _TITLE.findall(text))


def _two_responses(text: str, kw: Kwargs) -> bool:
    """Two different non-empty responses separated by `******` (and nothing else)."""
    parts = text.split(TWO_RESPONSES_SEPARATOR)
    responses = []
    for index, part in enumerate(parts):
        if part.strip():
            responses.append(part.strip())
        elif 0 < index < len(parts) - 1:
            return False
    return len(responses) == 2 and responses[0] != responses[1]


def _repeat_prompt(text: str, kw: Kwargs) -> bool:
    return text.strip().lower().startswith(kw["prompt_to_repeat"].strip().lower())


def _end_phrase(text: str, kw: Kwargs) -> bool:
    return text.strip().lower().endswith(kw["end_phrase"].strip().lower())


def _quotation(text: str, kw: Kwargs) -> bool:
    stripped = text.strip()
    return len(stripped) > 1 and stripped[0] == stripped[-1] == '"'


def _capital_word_frequency(text: str, kw: Kwargs) -> bool:
    count = sum(1 for word in _WORD.findall(text) if word.isupper())
    return _compare(count, kw["capital_relation"], kw["capital_frequency"])


def _all_capitals(text: str, kw: Kwargs) -> bool:
    return text.isupper()


def _all_lowercase(text: str, kw: Kwargs) -> bool:
    return text.islower()


def _no_comma(text: str, kw: Kwargs) -> bool:
    return "," not in text


# Kwargs: each instruction names its arguments and how each is checked.

Coerce = Callable[[object, str], Any]


def _integer(value: object, minimum: int, where: str) -> int:
    # JSON loaders and pandas turn ints into floats (100.0) when a column has nulls.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return value


def _count(value: object, where: str) -> int:
    return _integer(value, 0, where)


def _index(value: object, where: str) -> int:
    return _integer(value, 1, where)


def _relation(value: object, where: str) -> str:
    if isinstance(value, str) and value.strip().lower() in RELATIONS:
        return value.strip().lower()
    raise ValueError(f"{where} must be one of {', '.join(RELATIONS)}, got {value!r}")


def _letter(value: object, where: str) -> str:
    if isinstance(value, str) and len(value) == 1 and value.isalpha():
        return value.lower()
    raise ValueError(f"{where} must be a single letter, got {value!r}")


def _text(value: object, where: str) -> str:
    if isinstance(value, str) and value.strip():
        return value
    raise ValueError(f"{where} must be a non-empty string, got {value!r}")


def _words(value: object, where: str) -> list[str]:
    if isinstance(value, list | tuple) and value:
        return [_text(item, f"{where}[{index}]") for index, item in enumerate(value)]
    raise ValueError(f"{where} must be a non-empty list of strings, got {value!r}")


@dataclass(frozen=True)
class _Spec:
    check: Check
    params: Mapping[str, Coerce]


INSTRUCTIONS: Mapping[str, _Spec] = {
    "keywords:existence": _Spec(_keywords_exist, {"keywords": _words}),
    "keywords:frequency": _Spec(
        _keyword_frequency, {"keyword": _text, "frequency": _count, "relation": _relation}
    ),
    "keywords:forbidden_words": _Spec(_no_forbidden_words, {"forbidden_words": _words}),
    "keywords:letter_frequency": _Spec(
        _letter_frequency,
        {"letter": _letter, "let_frequency": _count, "let_relation": _relation},
    ),
    "length_constraints:number_words": _Spec(
        _number_words, {"num_words": _count, "relation": _relation}
    ),
    "length_constraints:number_sentences": _Spec(
        _number_sentences, {"num_sentences": _count, "relation": _relation}
    ),
    "length_constraints:number_paragraphs": _Spec(_number_paragraphs, {"num_paragraphs": _index}),
    "length_constraints:nth_paragraph_first_word": _Spec(
        _nth_paragraph_first_word,
        {"num_paragraphs": _index, "nth_paragraph": _index, "first_word": _text},
    ),
    "detectable_content:number_placeholders": _Spec(
        _number_placeholders, {"num_placeholders": _count}
    ),
    "detectable_content:postscript": _Spec(_postscript, {"postscript_marker": _text}),
    "detectable_format:number_bullet_lists": _Spec(_number_bullets, {"num_bullets": _count}),
    "detectable_format:constrained_response": _Spec(_constrained_response, {}),
    "detectable_format:number_highlighted_sections": _Spec(
        _number_highlights, {"num_highlights": _count}
    ),
    "detectable_format:multiple_sections": _Spec(
        _multiple_sections, {"section_spliter": _text, "num_sections": _count}
    ),
    "detectable_format:json_format": _Spec(_json_format, {}),
    "detectable_format:title": _Spec(_title, {}),
    "combination:two_responses": _Spec(_two_responses, {}),
    "combination:repeat_prompt": _Spec(_repeat_prompt, {"prompt_to_repeat": _text}),
    "startend:end_checker": _Spec(_end_phrase, {"end_phrase": _text}),
    "startend:quotation": _Spec(_quotation, {}),
    "change_case:capital_word_frequency": _Spec(
        _capital_word_frequency, {"capital_frequency": _count, "capital_relation": _relation}
    ),
    "change_case:english_capital": _Spec(_all_capitals, {}),
    "change_case:english_lowercase": _Spec(_all_lowercase, {}),
    "punctuation:no_comma": _Spec(_no_comma, {}),
}
INSTRUCTION_IDS = frozenset(INSTRUCTIONS)


@dataclass(frozen=True)
class Instruction:
    """One instruction of a row with its kwargs checked and normalised."""

    id: str
    kwargs: dict[str, Any]


def parse_instruction(instruction_id: object, kwargs: object, where: str = "") -> Instruction:
    """Check one instruction id and its kwargs; raise ValueError naming what is wrong.

    `None` values are dropped first (the Hugging Face IFEval rows carry every argument
    name of every instruction, unused ones null); unknown and missing names are errors.
    """
    spec = INSTRUCTIONS.get(instruction_id) if isinstance(instruction_id, str) else None
    if spec is None:
        known = ", ".join(sorted(INSTRUCTIONS))
        raise ValueError(f"{where}unknown instruction {instruction_id!r}; known: {known}")
    label = f"{where}{instruction_id}"
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"{label}: kwargs must be an object, got {kwargs!r}")
    given = {name: value for name, value in kwargs.items() if value is not None}
    _check_names(label, set(given), set(spec.params))
    checked = {name: coerce(given[name], f"{label}.{name}") for name, coerce in spec.params.items()}
    return Instruction(str(instruction_id), checked)


def _check_names(label: str, given: set[str], expected: set[str]) -> None:
    if unknown := given - expected:
        allowed = ", ".join(sorted(expected)) or "none"
        raise ValueError(
            f"{label}: unknown kwargs {', '.join(sorted(unknown))} (allowed: {allowed})"
        )
    if missing := expected - given:
        raise ValueError(f"{label}: missing kwargs {', '.join(sorted(missing))}")


def parse_row(row: Mapping[str, Any]) -> list[Instruction]:
    """The row's instructions, checked; ValueError names the first problem."""
    ids = row.get("instruction_id_list")
    if not isinstance(ids, list | tuple) or not ids:
        raise ValueError("instruction_id_list must be a non-empty list of instruction ids")
    kwargs = row.get("kwargs")
    if kwargs is None:
        kwargs = [None] * len(ids)
    if not isinstance(kwargs, list | tuple) or len(kwargs) != len(ids):
        raise ValueError(
            f"kwargs must be a list aligned with instruction_id_list ({len(ids)} entries)"
        )
    return [
        parse_instruction(instruction_id, arguments, f"instruction {index}: ")
        for index, (instruction_id, arguments) in enumerate(zip(ids, kwargs, strict=True))
    ]


def validate_row(row: Mapping[str, Any]) -> None:
    """Raise ValueError if the row's instructions or kwargs are unknown or malformed."""
    parse_row(row)


# Following: strict and loose


def loose_variants(response: str) -> list[str]:
    """The answer plus IFEval's lenient readings: without its first line, its last line or
    both, and each of those with every `*` removed."""
    lines = response.split("\n")
    cut = [
        response,
        "\n".join(lines[1:]).strip(),
        "\n".join(lines[:-1]).strip(),
        "\n".join(lines[1:-1]).strip(),
    ]
    return list(dict.fromkeys([*cut, *(text.replace("*", "") for text in cut)]))


def is_followed(instruction: Instruction, response: str, *, loose: bool = False) -> bool:
    """Whether the response follows the instruction (an empty response follows nothing)."""
    check = INSTRUCTIONS[instruction.id].check
    candidates = loose_variants(response) if loose else [response]
    return any(text.strip() and check(text, instruction.kwargs) for text in candidates)


def check_instruction(
    instruction_id: str, kwargs: Kwargs | None, response: str, *, loose: bool = False
) -> bool:
    """Parse one instruction and check the response against it (ValueError if malformed)."""
    return is_followed(parse_instruction(instruction_id, kwargs), response, loose=loose)


def score_instruction_following(
    answer: str | None, row: Mapping[str, Any], *, loose: bool = False
) -> Score:
    """Fraction of the row's instructions that `answer` follows, strict unless `loose`.

    No answer follows no instruction (0). The detail names every instruction with its
    kwargs and whether it was followed, and `all_followed`, IFEval's prompt-level result.
    A malformed row raises ScorerError (the API should have refused it: `validate_row`).
    """
    try:
        instructions = parse_row(row)
    except ValueError as exc:
        raise ScorerError(f"instruction_following: {exc}") from exc
    results = [is_followed(item, answer or "", loose=loose) for item in instructions]
    return Score(
        value=sum(results) / len(results),
        detail={
            "mode": "loose" if loose else "strict",
            "followed": sum(results),
            "total": len(results),
            "all_followed": all(results),
            "instructions": [
                {"id": item.id, "kwargs": item.kwargs, "followed": followed}
                for item, followed in zip(instructions, results, strict=True)
            ],
        },
    )


@dataclass(frozen=True)
class InstructionFollowingScorer:
    """The `instruction_following` scorer (`app.scoring.types.Scorer`); rows need
    `instruction_id_list` and `kwargs`, not a `ground_truth`."""

    loose: bool = False
    kind: ClassVar[str] = "instruction_following"
    needs_ground_truth: ClassVar[bool] = False

    def score(self, answer: str | None, row: Mapping[str, Any]) -> Score:
        return score_instruction_following(answer, row, loose=self.loose)

    def validate_row(self, row: Mapping[str, Any]) -> None:
        """Raise ValueError if the row cannot be scored (see the module's `validate_row`)."""
        validate_row(row)
