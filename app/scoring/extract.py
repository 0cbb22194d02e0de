"""Pull the final answer out of free text: the last boxed LaTeX, answer phrases, choice letters.

Stdlib only. Every extractor returns what it found *and* which rule found it, so a score's
detail can say why an answer was read the way it was.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_CHOICES = "ABCDEFGHIJ"

_THINK_END = "</think>"
_BOX = re.compile(r"\\(?:boxed|fbox)\b")
_BOX_SPACE_FORM = re.compile(r"\s+([^\s$]+)")  # `\boxed 5`
_ANSWER_ANCHOR = re.compile(
    r"\banswer\b(?:\s+(?:is|would\s+be|will\s+be|should\s+be)\b|[\s*_]*[:=])[\s*_:]*", re.I
)
_TEXT_WRAPPER = re.compile(r"^\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{(.*)\}$", re.S)
_LONE_LETTER = re.compile(r"""^[\s*_"'`(\[{]*([A-Za-z])[\s*_"'`)\]}.:]*$""")
_LEADING_LETTER = re.compile(r"^\(?([A-Za-z])(?:\)|[.:])\s")  # box content "C) 42 kJ"
_AFTER = r"[\s*_]*\(?\[?([A-Za-z])(?![A-Za-z0-9_'\u2019])"
_OPTION = r"(?:(?:option|choice)\s+)?"
_MCQ_JSON = re.compile(r""""answer"\s*:\s*"\s*\(?([A-Za-z])\)?\s*\"""", re.I)
_MCQ_LABEL = re.compile(r"\banswer\b[\s*_]*[:=][\s*_]*" + _OPTION + _AFTER, re.I)
_MCQ_PHRASE = re.compile(
    r"(?:\b(?:answer|option|choice)\s+(?:is|would\s+be|should\s+be|will\s+be)\b[\s:]*"
    + _OPTION
    + r"|\bI\s+(?:choose|pick|select|go\s+with)\s+"
    + _OPTION
    + r")"
    + _AFTER,
    re.I,
)
_MCQ_IS_CORRECT = re.compile(
    r"(?<![A-Za-z0-9_])\(?([A-Z])\)?\s+(?i:is\s+(?:the\s+)?(?:correct|right|best)\b)"
)
_STANDALONE_CAPITAL = re.compile(r"(?<![A-Za-z0-9_'\u2019])([A-Z])(?![A-Za-z0-9_'\u2019])")
_WORD_FOLLOWS = re.compile(r"\s+[a-z]")


@dataclass(frozen=True)
class Candidate:
    """A final answer as text and the rule that found it."""

    text: str
    source: str  # "boxed" | "answer_phrase" | "last_line" | "empty"


@dataclass(frozen=True)
class Choice:
    """A multiple-choice letter (upper case) and the rule that found it."""

    letter: str
    rule: str  # "lone" | "boxed" | "json" | "answer_label" | "answer_phrase" | "is_correct"
    # | "last_line" | "last_capital"


def strip_reasoning(text: str) -> str:
    """The text after the last `</think>` (a reasoning model's visible answer), else all."""
    _, sep, tail = text.rpartition(_THINK_END)
    return tail if sep else text


def last_boxed(text: str) -> str | None:
    """Content of the `\\boxed{}`/`\\fbox{}` that closes last (nested braces kept), or None.

    Unclosed boxes (a truncated answer) are skipped; `\\boxed 5` counts as a box of `5`.
    """
    best: tuple[int, int, str] | None = None  # (end, -start, content)
    for match in _BOX.finditer(text):
        found = _box_at(text, match.end())
        if found is None:
            continue
        end, content = found
        key = (end, -match.start(), content)
        if best is None or key[:2] > best[:2]:
            best = key
    if best is None:
        return None
    content = best[2]
    while (inner := _sole_box(content)) is not None:
        content = inner  # \boxed{\boxed{3}} is a box of 3
    return content


def _sole_box(content: str) -> str | None:
    """The inner content if `content` is nothing but one braced box, else None."""
    stripped = content.strip()
    match = _BOX.match(stripped)
    if match is None:
        return None
    found = _box_at(stripped, match.end())
    if found is None or found[0] != len(stripped) or not stripped.endswith("}"):
        return None
    return found[1]


def _box_at(text: str, pos: int) -> tuple[int, str] | None:
    """(end, content) of the box whose name ends at `pos`, or None if it never closes."""
    rest = text[pos:]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
        start = pos + len(rest) - len(stripped) + 1
        end = _closing_brace(text, start)
        return None if end is None else (end + 1, text[start:end])
    if space_form := _BOX_SPACE_FORM.match(rest):
        return pos + space_form.end(), space_form.group(1)
    return None


def _closing_brace(text: str, start: int) -> int | None:
    """Index of the `}` closing the group opened just before `start`; `\\{`, `\\}` skipped."""
    depth, i = 1, start
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def final_answer(text: str) -> Candidate:
    """The last box, else the text after the last "answer is"/"Answer:", else the last line."""
    boxed = last_boxed(text)
    if boxed is not None:
        return Candidate(boxed.strip(), "boxed")
    anchors = list(_ANSWER_ANCHOR.finditer(text))
    for anchor in reversed(anchors):
        value = _first_line(text[anchor.end() :])
        if value:
            return Candidate(_trim(value), "answer_phrase")
    last = _last_line(text)
    return Candidate(_trim(last), "last_line") if last else Candidate("", "empty")


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def _trim(value: str) -> str:
    """Drop markdown emphasis and a sentence's final full stop: "**42**." -> "42"."""
    value = value.strip().strip("*_").strip()
    if value.endswith(".") and not value.endswith(".."):
        value = value[:-1].rstrip()
    return value.strip("*_").strip()


def choice_letter(text: str, choices: str = DEFAULT_CHOICES) -> Choice | None:
    """The chosen letter among `choices` (case-insensitive), by the first rule that finds one.

    Rules, most explicit first: the whole text is a letter ("C", "(c)", "**C.**"); the last
    box holds one; JSON `"answer": "C"`; the last "Answer: (B)"; the last "the answer is C"
    or "I choose C"; "C is correct"; the last line is a letter; the last standalone capital
    (letters inside words never count, nor "A"/"I" used as words).
    """
    allowed = choices.upper()
    for rule, finder in _CHOICE_RULES:
        letter = finder(text, allowed)
        if letter is not None:
            return Choice(letter, rule)
    return None


def _lone(text: str, allowed: str) -> str | None:
    match = _LONE_LETTER.match(text)
    return _allowed(match.group(1), allowed) if match else None


def _boxed(text: str, allowed: str) -> str | None:
    content = last_boxed(text)
    if content is None:
        return None
    content = content.strip()
    while wrapped := _TEXT_WRAPPER.match(content):
        content = wrapped.group(1).strip()
    match = _LONE_LETTER.match(content) or _LEADING_LETTER.match(content)
    return _allowed(match.group(1), allowed) if match else None


def _last_of(pattern: re.Pattern[str]) -> Callable[[str, str], str | None]:
    def find(text: str, allowed: str) -> str | None:
        for match in reversed(list(pattern.finditer(text))):
            letter = match.group(1)
            if letter.islower() and _WORD_FOLLOWS.match(text, match.end()):
                continue  # "the answer is a reaction that ..." names no choice
            if found := _allowed(letter, allowed):
                return found
        return None

    return find


def _last_line_letter(text: str, allowed: str) -> str | None:
    return _lone(_last_line(text), allowed)


def _last_capital(text: str, allowed: str) -> str | None:
    for match in reversed(list(_STANDALONE_CAPITAL.finditer(text))):
        letter = match.group(1)
        if letter in "AI" and _WORD_FOLLOWS.match(text, match.end()):
            continue  # the article "A" or the pronoun "I"
        if letter in allowed:
            return letter
    return None


def _allowed(letter: str, allowed: str) -> str | None:
    upper = letter.upper()
    return upper if upper in allowed else None


_CHOICE_RULES: tuple[tuple[str, Callable[[str, str], str | None]], ...] = (
    ("lone", _lone),
    ("boxed", _boxed),
    ("json", _last_of(_MCQ_JSON)),
    ("answer_label", _last_of(_MCQ_LABEL)),
    ("answer_phrase", _last_of(_MCQ_PHRASE)),
    ("is_correct", _last_of(_MCQ_IS_CORRECT)),
    ("last_line", _last_line_letter),
    ("last_capital", _last_capital),
)
