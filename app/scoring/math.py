"""The `math` scorer: final answer and ground truth compared by mathematical equivalence.

The answer's last `\\boxed{}` (else the text after "the answer is"/"Answer:", else the last
line, else the whole text) and the ground truth (its box, else all of it) are parsed by
math-verify, Hugging Face's LaTeX-to-SymPy verifier that the reference package's math
reward also uses: fractions, decimals, percentages, roots, sets, intervals, equations and
units are compared as mathematics, not text. When it says no, a numeric check accepts two
values within `tolerance` (relative, absolute below 1) unless both are integers.

math-verify bounds parsing and comparing with SIGALRM, which only works on the main thread:
there each step gets `timeout_s`, and running over is a `ScorerError`. On any other thread
the bound is off and the caller must bound the time (score in a worker process).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

from app.scoring.extract import Candidate, final_answer, last_boxed, strip_reasoning
from app.scoring.types import Score, ScorerError, ground_truths

_SCIENTIFIC = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)[eE][+-]?\d+")  # math-verify reads 1e-3 as 1
_PROSE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")  # a word, not a LaTeX command
_SHOWN_CHARS = 200


@dataclass(frozen=True)
class MathScorer:
    """Scores 1 when the answer equals the ground truth as mathematics, else 0."""

    tolerance: float = 1e-6
    timeout_s: int = 5

    kind: ClassVar[str] = "math"
    needs_ground_truth: ClassVar[bool] = True

    def score(self, answer: str | None, row: Mapping[str, Any]) -> Score:
        references = ground_truths(row, self.kind)
        golds = [self._parse_gold(reference) for reference in references]
        if answer is None:
            return Score(0.0, {"extracted": None, "reason": "no answer"})
        candidate, parsed = self._parse_answer(strip_reasoning(answer))
        detail: dict[str, Any] = {
            "extracted": _clip(candidate.text),
            "source": candidate.source,
            "parsed": _show(parsed),
        }
        for reference, gold in zip(references, golds, strict=True):
            if match := self._equal(gold, parsed):
                return Score(1.0, {**detail, **_gold_detail(reference, gold), "match": match})
        return Score(0.0, {**detail, **_gold_detail(references[0], golds[0]), "match": None})

    def _parse_gold(self, reference: str) -> list[Any]:
        content = last_boxed(reference)
        if content is None:
            parsed = self._parse(reference, boxed=False)
        else:
            parsed = self._parse(content, boxed=True)
        if not _has_expression(parsed):
            raise ScorerError(
                f"scorer 'math': ground truth {_clip(reference)!r} could not be parsed",
                {"ground_truth": _clip(reference)},
            )
        return parsed

    def _parse_answer(self, text: str) -> tuple[Candidate, list[Any]]:
        candidate = final_answer(text)
        if candidate.source == "empty":
            return candidate, []
        parsed = self._parse(candidate.text, boxed=candidate.source == "boxed")
        if candidate.source != "boxed" and not _has_expression(parsed):
            whole = self._parse(text, boxed=False)  # math-verify finds the last expression
            if _has_expression(whole):
                return Candidate(text.strip(), "text"), whole
        return candidate, parsed

    def _parse(self, text: str, *, boxed: bool) -> list[Any]:
        """math-verify's parse: [SymPy object, its string] or [string] or []."""
        import sympy
        from math_verify import parse

        text = text.replace("\u2212", "-").strip()  # Unicode minus
        if _SCIENTIFIC.fullmatch(text):
            return [sympy.Float(text), text]
        latex = boxed or not _PROSE.search(text)
        forms = [f"\\boxed{{{text}}}", text] if latex else [text]
        first: list[Any] = []
        for form in forms:
            parsed: list[Any] = self._guarded(
                partial(parse, form, parsing_timeout=self._timeout(), raise_on_error=True)
            )
            if _has_expression(parsed):
                return parsed
            first = first or parsed
        return first

    def _equal(self, gold: list[Any], parsed: list[Any]) -> str | None:
        """How the answer matched ("math_verify" or "tolerance"), or None."""
        from math_verify import verify

        if not parsed:
            return None
        equal = partial(
            verify,
            gold,
            parsed,
            float_rounding=_float_rounding(self.tolerance),
            timeout_seconds=self._timeout(),
            raise_on_error=True,
        )
        if self._guarded(equal):
            return "math_verify"
        if self._guarded(partial(self._close, gold, parsed)):
            return "tolerance"
        return None

    def _close(self, gold: list[Any], parsed: list[Any]) -> bool:
        """The numeric fallback, under the same SIGALRM bound as math-verify's steps."""
        from math_verify.utils import timeout

        close: Callable[[], bool] = timeout(self._timeout())(
            partial(_numerically_close, gold, parsed, self.tolerance)
        )
        return close()

    def _timeout(self) -> int | None:
        on_main = threading.current_thread() is threading.main_thread()
        return self.timeout_s if on_main else None

    def _guarded(self, call: Callable[[], Any]) -> Any:
        """Run a math-verify step; its timeout or failure becomes a `ScorerError`."""
        from math_verify.errors import TimeoutException

        try:
            return call()
        except TimeoutException as exc:
            raise ScorerError(
                f"scorer 'math' timed out after {self.timeout_s} s", {"timeout_s": self.timeout_s}
            ) from exc
        except Exception as exc:
            raise ScorerError(
                f"scorer 'math' failed: {type(exc).__name__}: {exc}",
                {"exception": type(exc).__name__},
            ) from exc


def _float_rounding(tolerance: float) -> int:
    """Decimals math-verify rounds floats to: no coarser than `tolerance`."""
    if tolerance <= 0:
        return 15
    return max(0, min(15, math.ceil(-math.log10(tolerance) - 1e-9)))


def _numerically_close(gold: list[Any], parsed: list[Any], tolerance: float) -> bool:
    expected, actual = _number(gold), _number(parsed)
    if expected is None or actual is None:
        return False
    if expected[1] and actual[1]:
        return False  # two integers are equal or not; math-verify has said not
    return abs(actual[0] - expected[0]) <= tolerance * max(1.0, abs(expected[0]))


def _number(parsed: list[Any]) -> tuple[complex, bool] | None:
    """(value, is_integer) of the first SymPy object if it is a finite number, else None."""
    import sympy

    expression = next((item for item in parsed if isinstance(item, sympy.Basic)), None)
    if expression is None:
        return None
    try:
        expression = expression.doit()  # 50% is 50*UnevaluatedExpr(1/100)
        if not expression.is_number:
            return None
        value = complex(expression.evalf(30))
    except (TypeError, ValueError, ArithmeticError):
        return None
    if not (math.isfinite(value.real) and math.isfinite(value.imag)):
        return None
    return value, bool(expression.is_integer)


def _has_expression(parsed: list[Any]) -> bool:
    import sympy

    return any(isinstance(item, sympy.Basic | sympy.MatrixBase) for item in parsed)


def _gold_detail(reference: str, gold: list[Any]) -> dict[str, Any]:
    return {"ground_truth": _clip(reference), "gold_parsed": _show(gold)}


def _clip(text: str) -> str:
    """At most the last `_SHOWN_CHARS` characters: the end of an answer is what was read."""
    return text if len(text) <= _SHOWN_CHARS else "…" + text[-_SHOWN_CHARS:]


def _show(parsed: list[Any]) -> str | None:
    """The first parsed form as text (SymPy objects first), cut short; None if nothing."""
    if not parsed:
        return None
    try:
        return str(parsed[0])[:_SHOWN_CHARS]
    except (ValueError, RecursionError):
        return "<too large to print>"
