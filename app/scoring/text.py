"""Text scorers: `mcq`, `exact`, `contains`, `regex`, token `f1` and `rouge_l`.

`mcq` compares the chosen letter (see `extract.choice_letter` for the fallbacks) with the
ground truth's letter, case-insensitively.
`exact` and `contains` compare whitespace-collapsed, case-folded text (or SQuAD-normalised
text with `squad`); `f1` is the SQuAD token F1; `rouge_l` is the ROUGE-L F-measure of
Google's `rouge-score`. With several references (a list `ground_truth`) the best one counts.
The answer is read after a reasoning model's last `</think>`.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

from app.scoring.extract import DEFAULT_CHOICES, choice_letter, strip_reasoning
from app.scoring.types import Score, ScorerError, ground_truths

_SHOWN_CHARS = 200
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
REGEX_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE}


def squad_normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _clip(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"


@dataclass(frozen=True)
class McqScorer:
    """1 when the letter the answer chose is the ground truth's letter."""

    choices: str = DEFAULT_CHOICES

    kind: ClassVar[str] = "mcq"
    needs_ground_truth: ClassVar[bool] = True

    def score(self, answer: str | None, row: Mapping[str, Any]) -> Score:
        expected = [self._expected(reference) for reference in ground_truths(row, self.kind)]
        if answer is None:
            return Score(0.0, {"extracted": None, "reason": "no answer"})
        chosen = choice_letter(strip_reasoning(answer), self.choices)
        detail = {
            "extracted": None if chosen is None else chosen.letter,
            "rule": None if chosen is None else chosen.rule,
            "ground_truth": expected[0] if len(expected) == 1 else expected,
        }
        return Score(1.0 if chosen is not None and chosen.letter in expected else 0.0, detail)

    def _expected(self, reference: str) -> str:
        found = choice_letter(reference, self.choices)
        if found is None:
            raise ScorerError(
                f"scorer 'mcq': ground truth {_clip(reference)!r} names none of the choices "
                f"{self.choices}",
                {"ground_truth": _clip(reference), "choices": self.choices},
            )
        return found.letter


@dataclass(frozen=True)
class _Normalized:
    """Shared by `exact` and `contains`: how both sides are normalised before comparing."""

    case_sensitive: bool = False
    squad: bool = False

    kind: ClassVar[str]
    needs_ground_truth: ClassVar[bool] = True

    def normalize(self, text: str) -> str:
        if self.squad:
            return squad_normalize(text)
        text = " ".join(text.split())
        return text if self.case_sensitive else text.casefold()

    def references(self, row: Mapping[str, Any], kind: str) -> list[tuple[str, str]]:
        pairs = [(reference, self.normalize(reference)) for reference in ground_truths(row, kind)]
        if empty := [reference for reference, normal in pairs if not normal]:
            raise ScorerError(
                f"scorer {kind!r}: ground truth {_clip(empty[0])!r} is empty once normalised",
                {"ground_truth": _clip(empty[0])},
            )
        return pairs

    def first_match(
        self, answer: str | None, row: Mapping[str, Any], matches: Callable[[str, str], bool]
    ) -> Score:
        """1 for the first reference the normalised answer `matches`, else 0."""
        references = self.references(row, self.kind)
        if answer is None:
            return Score(0.0, {"answer": None, "reason": "no answer"})
        normal = self.normalize(strip_reasoning(answer))
        for reference, expected in references:
            if matches(normal, expected):
                return Score(1.0, {"answer": _clip(normal), "ground_truth": _clip(reference)})
        return Score(0.0, {"answer": _clip(normal), "ground_truth": _clip(references[0][0])})


@dataclass(frozen=True)
class ExactScorer(_Normalized):
    """1 when the normalised answer equals a normalised reference."""

    kind: ClassVar[str] = "exact"

    def score(self, answer: str | None, row: Mapping[str, Any]) -> Score:
        return self.first_match(answer, row, lambda normal, expected: normal == expected)


@dataclass(frozen=True)
class ContainsScorer(_Normalized):
    """1 when a normalised reference occurs in the normalised answer, as whole words."""

    kind: ClassVar[str] = "contains"

    def score(self, answer: str | None, row: Mapping[str, Any]) -> Score:
        def found(normal: str, expected: str) -> bool:
            return _whole_words(expected).search(normal) is not None

        return self.first_match(answer, row, found)


def _whole_words(needle: str) -> re.Pattern[str]:
    """`needle` not glued to a letter or digit on a side where it has one: 42 is not in 420."""
    head = r"(?<!\w)" if re.match(r"\w", needle) else ""
    tail = r"(?!\w)" if re.search(r"\w$", needle) else ""
    return re.compile(head + re.escape(needle) + tail)


@dataclass(frozen=True)
class RegexScorer:
    """1 when `pattern` matches the answer; without `pattern`, each row's ground truth is one."""

    pattern: str | None = None
    flags: str = ""
    fullmatch: bool = False

    kind: ClassVar[str] = "regex"

    def __post_init__(self) -> None:
        if unknown := sorted(set(self.flags) - set(REGEX_FLAGS)):
            raise ValueError(f"regex flags must be among {''.join(REGEX_FLAGS)}, not {unknown}")
        if self.pattern is not None:
            try:
                self._compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"regex pattern {self.pattern!r} is invalid: {exc}") from exc

    @property
    def needs_ground_truth(self) -> bool:
        return self.pattern is None

    def score(self, answer: str | None, row: Mapping[str, Any]) -> Score:
        patterns = [self.pattern] if self.pattern is not None else ground_truths(row, self.kind)
        compiled = [self._row_pattern(pattern) for pattern in patterns]
        if answer is None:
            return Score(0.0, {"answer": None, "reason": "no answer"})
        text = strip_reasoning(answer).strip()
        for pattern in compiled:
            match = pattern.fullmatch(text) if self.fullmatch else pattern.search(text)
            if match:
                return Score(1.0, {"pattern": pattern.pattern, "matched": _clip(match.group(0))})
        return Score(0.0, {"pattern": compiled[0].pattern, "matched": None})

    def _compile(self, pattern: str) -> re.Pattern[str]:
        flags = 0
        for letter in self.flags:
            flags |= REGEX_FLAGS[letter]
        return re.compile(pattern, flags)

    def _row_pattern(self, pattern: str) -> re.Pattern[str]:
        try:
            return self._compile(pattern)
        except re.error as exc:
            raise ScorerError(
                f"scorer 'regex': pattern {_clip(pattern)!r} is invalid: {exc}",
                {"pattern": _clip(pattern)},
            ) from exc


@dataclass(frozen=True)
class F1Scorer:
    """SQuAD token F1 between the answer and the best reference (0 for an empty answer)."""

    kind: ClassVar[str] = "f1"
    needs_ground_truth: ClassVar[bool] = True

    def score(self, answer: str | None, row: Mapping[str, Any]) -> Score:
        references = [
            (reference, squad_normalize(reference).split())
            for reference in ground_truths(row, self.kind)
        ]
        _require_tokens(self.kind, references)
        tokens = [] if answer is None else squad_normalize(strip_reasoning(answer)).split()
        best: dict[str, Any] = {}
        for reference, expected in references:
            precision, recall, f1 = _token_f1(tokens, expected)
            if not best or f1 > best["f1"]:
                best = {
                    "f1": f1,
                    "precision": precision,
                    "recall": recall,
                    "ground_truth": _clip(reference),
                }
        return Score(best["f1"], {**best, "answer_tokens": None if answer is None else len(tokens)})


def _token_f1(predicted: list[str], expected: list[str]) -> tuple[float, float, float]:
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0, 0.0, 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return precision, recall, 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class RougeLScorer:
    """ROUGE-L F-measure (rouge-score) between the answer and the best reference."""

    use_stemmer: bool = False

    kind: ClassVar[str] = "rouge_l"
    needs_ground_truth: ClassVar[bool] = True

    def score(self, answer: str | None, row: Mapping[str, Any]) -> Score:
        from rouge_score.tokenize import tokenize

        scorer = _rouge(self.use_stemmer)
        references = [
            (reference, tokenize(reference, None)) for reference in ground_truths(row, self.kind)
        ]
        _require_tokens(self.kind, references)
        text = "" if answer is None else strip_reasoning(answer)
        best: dict[str, Any] = {}
        for reference, _ in references:
            result = scorer.score(reference, text)["rougeL"]
            if not best or result.fmeasure > best["rouge_l"]:
                best = {
                    "rouge_l": float(result.fmeasure),
                    "precision": float(result.precision),
                    "recall": float(result.recall),
                    "ground_truth": _clip(reference),
                }
        return Score(min(1.0, best["rouge_l"]), best)


@lru_cache(maxsize=2)
def _rouge(use_stemmer: bool) -> Any:
    from rouge_score.rouge_scorer import RougeScorer

    return RougeScorer(["rougeL"], use_stemmer=use_stemmer)


def _require_tokens(kind: str, references: list[tuple[str, list[str]]]) -> None:
    """A reference with no tokens would score every answer 0 (or 1): refuse it."""
    hint = _TOKEN_HINTS[kind]
    for reference, tokens in references:
        if not tokens:
            raise ScorerError(
                f"scorer {kind!r}: ground truth {_clip(reference)!r} has no tokens ({hint})",
                {"ground_truth": _clip(reference)},
            )


_TOKEN_HINTS = {
    "f1": "SQuAD normalisation drops punctuation and the articles a, an, the",
    "rouge_l": "rouge-score keeps only ASCII letters and digits; use f1 for other scripts",
}
