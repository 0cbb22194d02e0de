"""Build a scorer from its spec: `{"kind": "math", "tolerance": 1e-6}` and the like.

`scorer_for` checks the kind and every option up-front and raises `ValueError` with a
message fit for an API client, so a bad spec fails when the experiment is created, not
halfway through it. To add a kind, write a builder and give it a row in `_BUILDERS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from app.scoring.extract import DEFAULT_CHOICES
from app.scoring.instructions import InstructionFollowingScorer
from app.scoring.judge import AGGREGATES, MAX_REPEATS, MAX_RUBRIC_CHARS, LlmJudgeScorer
from app.scoring.math import MathScorer
from app.scoring.package import PackageMathScorer, PackageMcqScorer
from app.scoring.python_code import PythonLimits, PythonScorer, check_code
from app.scoring.text import (
    ContainsScorer,
    ExactScorer,
    F1Scorer,
    McqScorer,
    RegexScorer,
    RougeLScorer,
)
from app.scoring.types import Scorer
from app.scoring.verifier import VerifierScorer

MAX_PATTERN_CHARS = 2000


class _Options:
    """A spec's options, each read once with its type checked; leftovers are refused."""

    def __init__(
        self, kind: str, spec: Mapping[str, Any], python_limits: PythonLimits | None = None
    ) -> None:
        self.kind = kind
        self.python_limits = python_limits or PythonLimits()
        self._left = {key: value for key, value in spec.items() if key != "kind"}

    def flag(self, name: str, default: bool) -> bool:
        value = self._left.pop(name, default)
        if not isinstance(value, bool):
            raise self._error(name, "must be true or false", value)
        return value

    def number(self, name: str, default: float, low: float, high: float) -> float:
        value = self._left.pop(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._error(name, "must be a number", value)
        if not (math.isfinite(value) and low <= value <= high):
            raise self._error(name, f"must be between {low:g} and {high:g}", value)
        return float(value)

    def integer(self, name: str, default: int, low: int, high: int) -> int:
        value = self._left.pop(name, default)
        if isinstance(value, float) and value.is_integer():  # JSON's 5.0 is a whole number
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self._error(name, f"must be a whole number from {low} to {high}", value)
        return value

    def text(self, name: str, default: str | None) -> str | None:
        value = self._left.pop(name, default)
        if value is not None and not isinstance(value, str):
            raise self._error(name, "must be a string", value)
        return value

    def raw(self, name: str) -> object:
        """The option as given (None when absent), for a builder that checks it itself."""
        return self._left.pop(name, None)

    def done(self) -> None:
        if self._left:
            raise ValueError(
                f"scorer {self.kind!r} has no option(s) {', '.join(sorted(map(str, self._left)))}"
            )

    def _error(self, name: str, rule: str, value: object) -> ValueError:
        return ValueError(f"scorer {self.kind!r}: option {name!r} {rule}, got {value!r}")


def _math(options: _Options) -> Scorer:
    if options.flag("package", False):  # the package's rule has no options of its own
        return PackageMathScorer()
    return MathScorer(
        tolerance=options.number("tolerance", 1e-6, 0.0, 0.5),
        timeout_s=options.integer("timeout_s", 5, 1, 60),
    )


def _mcq(options: _Options) -> Scorer:
    if options.flag("package", False):
        return PackageMcqScorer()
    choices = options.text("choices", DEFAULT_CHOICES) or ""
    upper = choices.upper()
    if not (upper.isascii() and upper.isalpha() and 2 <= len(upper) <= 26):
        raise ValueError(f"scorer 'mcq': choices must be 2 to 26 letters, got {choices!r}")
    if len(set(upper)) != len(upper):
        raise ValueError(f"scorer 'mcq': choices must not repeat a letter, got {choices!r}")
    return McqScorer(choices=upper)


def _exact(options: _Options) -> Scorer:
    return ExactScorer(**_normalization(options))


def _contains(options: _Options) -> Scorer:
    return ContainsScorer(**_normalization(options))


def _normalization(options: _Options) -> dict[str, bool]:
    case_sensitive = options.flag("case_sensitive", False)
    squad = options.flag("squad", False)
    if case_sensitive and squad:
        raise ValueError(
            f"scorer {options.kind!r}: squad normalisation lower-cases; it cannot be case_sensitive"
        )
    return {"case_sensitive": case_sensitive, "squad": squad}


def _regex(options: _Options) -> Scorer:
    pattern = options.text("pattern", None)
    if pattern is not None and not 0 < len(pattern) <= MAX_PATTERN_CHARS:
        raise ValueError(f"scorer 'regex': pattern must be 1 to {MAX_PATTERN_CHARS} characters")
    return RegexScorer(
        pattern=pattern,
        flags=options.text("flags", "") or "",
        fullmatch=options.flag("fullmatch", False),
    )


def _f1(options: _Options) -> Scorer:
    return F1Scorer()


def _rouge_l(options: _Options) -> Scorer:
    return RougeLScorer(use_stemmer=options.flag("use_stemmer", False))


def _instruction_following(options: _Options) -> Scorer:
    return InstructionFollowingScorer(loose=options.flag("loose", False))


def _python(options: _Options) -> Scorer:
    limits = options.python_limits
    return PythonScorer(
        code=check_code(options.raw("code"), limits.code_max_bytes),
        timeout_s=options.integer("timeout_s", limits.timeout_s, 1, limits.max_timeout_s),
        memory_mb=options.integer("memory_mb", limits.memory_mb, 64, limits.max_memory_mb),
        output_bytes=options.integer(
            "output_bytes", limits.output_bytes, 1024, limits.max_output_bytes
        ),
        pids_limit=limits.pids_limit,
        scratch_mb=limits.scratch_mb,
    )


def _llm_judge(options: _Options) -> Scorer:
    profile = options.text("profile", None)
    if not profile:
        raise ValueError("scorer 'llm_judge' needs a 'profile' (an LLM profile name)")
    model = options.text("model", None)
    if model is not None and not model.strip():
        raise ValueError("scorer 'llm_judge': option 'model' must not be empty")
    rubric = options.text("rubric", None)
    if rubric is not None and not 0 < len(rubric.strip()) <= MAX_RUBRIC_CHARS:
        raise ValueError(f"scorer 'llm_judge': rubric must be 1 to {MAX_RUBRIC_CHARS} characters")
    aggregate = options.text("aggregate", "majority")
    found = next((known for known in AGGREGATES if known == aggregate), None)
    if found is None:
        rule = f"aggregate must be one of {', '.join(AGGREGATES)}"
        raise ValueError(f"scorer 'llm_judge': {rule}, got {aggregate!r}")
    return LlmJudgeScorer(
        profile=profile,
        model=model,
        rubric=rubric,
        repeats=options.integer("repeats", 1, 1, MAX_REPEATS),
        aggregate=found,
        temperature=options.number("temperature", 0.7, 0.0, 2.0),
    )


_BUILDERS: dict[str, Callable[[_Options], Scorer]] = {
    "math": _math,
    "mcq": _mcq,
    "exact": _exact,
    "contains": _contains,
    "regex": _regex,
    "f1": _f1,
    "rouge_l": _rouge_l,
    "instruction_following": _instruction_following,
    "llm_judge": _llm_judge,
    "python": _python,
    "verifier": lambda options: VerifierScorer(),
}


def scorer_kinds() -> list[str]:
    """The kinds `scorer_for` knows, sorted."""
    return sorted(_BUILDERS)


def scorer_for(spec: Mapping[str, Any], *, python_limits: PythonLimits | None = None) -> Scorer:
    """The scorer a spec names, its options checked; `ValueError` says what is wrong.

    `python_limits`: the server's bounds on a `python` scorer (`PythonLimits.from_settings`);
    None: the built-in defaults.
    """
    if not isinstance(spec, Mapping):
        raise ValueError(f"a scorer spec must be an object with a 'kind', got {spec!r}")
    kind = spec.get("kind")
    if not isinstance(kind, str) or kind not in _BUILDERS:
        raise ValueError(f"unknown scorer kind {kind!r}; known: {', '.join(scorer_kinds())}")
    options = _Options(kind, spec, python_limits)
    scorer = _BUILDERS[kind](options)
    options.done()
    return scorer
