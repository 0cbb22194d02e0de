"""The JSON Schema of a scorer spec, for the OpenAPI document: one branch per kind.

`registry.scorer_for` is the authority (it builds the scorer and says what is wrong); this
states the same options and bounds for generated clients and fuzzers, so that a spec the
document admits is one the server takes. What no JSON Schema can say is left to the
registry and said in the descriptions: `python` code must parse and define
`compute_score`, a `regex` pattern must compile, `mcq` choices must not repeat a letter.
tests/scoring/test_spec_schema.py holds the two to each other.
"""

from __future__ import annotations

from typing import Any

from app.scoring.judge import AGGREGATES, MAX_REPEATS, MAX_RUBRIC_CHARS
from app.scoring.python_code import PythonLimits
from app.scoring.registry import MAX_PATTERN_CHARS
from app.scoring.text import REGEX_FLAGS

_FLAG = {"type": "boolean"}
_FALSE = {"type": "boolean", "enum": [False]}
"""Not `const: false`: openapi-python-client writes code that does not parse for it."""
_NOT_BLANK = r"\S"


def _title(name: str) -> str:
    """`llm_judge` -> `LlmJudgeScorer`: a generated client's class name, one per branch."""
    return "".join(part.capitalize() for part in name.split("_")) + "Scorer"


def _kind(name: str, description: str, **options: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "title": _title(name),
        "description": description,
        "properties": {"kind": {"const": name}, **options},
        "required": ["kind"],
        "additionalProperties": False,
    }


def _number(low: float, high: float) -> dict[str, Any]:
    return {"type": "number", "minimum": low, "maximum": high}


def _integer(low: int, high: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": low, "maximum": high}


def _package(name: str) -> dict[str, Any]:
    return {
        **_kind(
            name,
            f"`{name}` as the paper's package scores it (no options of its own).",
            package={"const": True},
        ),
        "title": _title(f"package_{name}"),
        "required": ["kind", "package"],
    }


def scorer_schema(
    limits: PythonLimits,
    profiles: list[str],
    model_rules: list[dict[str, Any]],
    *,
    kinds: set[str] | None = None,
) -> dict[str, Any]:
    """A scorer spec's schema on a server with these python limits and LLM profiles
    (`model_rules`: which models each profile takes, as `if`/`then` on `profile` and
    `model`); `kinds`: only these (a regrade takes no `verifier`)."""
    normalization = {"case_sensitive": _FLAG, "squad": _FLAG}
    branches = [
        _kind(
            "math",
            "A number or expression, compared with the ground truth.",
            package=_FALSE,
            tolerance=_number(0.0, 0.5),
            timeout_s=_integer(1, 60),
        ),
        _package("math"),
        _kind(
            "mcq",
            "A choice letter, compared with the ground truth. `choices` must not repeat one.",
            package=_FALSE,
            choices={"type": "string", "pattern": "^[A-Za-z]{2,26}$"},
        ),
        _package("mcq"),
        {
            **_kind("exact", "The whole answer equals a ground truth.", **normalization),
            "not": _both_flags(),
        },
        {
            **_kind("contains", "The answer contains a ground truth.", **normalization),
            "not": _both_flags(),
        },
        _kind(
            "regex",
            "The answer matches `pattern` (it must compile), or each row's ground truth.",
            pattern={
                "type": ["string", "null"],
                "minLength": 1,
                "maxLength": MAX_PATTERN_CHARS,
            },
            flags={"type": ["string", "null"], "pattern": f"^[{''.join(REGEX_FLAGS)}]*$"},
            fullmatch=_FLAG,
        ),
        _kind("f1", "Token F1 with the ground truth."),
        _kind("rouge_l", "ROUGE-L with the ground truth.", use_stemmer=_FLAG),
        _kind("instruction_following", "IFEval's instructions of each row.", loose=_FLAG),
        {
            **_kind(
                "python",
                "Your `compute_score(agent_answer, ground_truth, **row)`, run in a sandbox "
                "(`code` must parse and define it).",
                code={"type": "string", "minLength": 1, "maxLength": limits.code_max_bytes},
                timeout_s=_integer(1, limits.max_timeout_s),
                memory_mb=_integer(64, limits.max_memory_mb),
                output_bytes=_integer(1024, limits.max_output_bytes),
            ),
            "required": ["kind", "code"],
        },
        {
            **_kind(
                "llm_judge",
                "A model of one of this server's LLM profiles judges the answer.",
                profile={"type": "string", **({"enum": profiles} if profiles else {})},
                model={"type": ["string", "null"], "minLength": 1, "pattern": _NOT_BLANK},
                rubric={
                    "type": ["string", "null"],
                    "maxLength": MAX_RUBRIC_CHARS,
                    "pattern": _NOT_BLANK,
                },
                aggregate={"type": "string", "enum": list(AGGREGATES)},
                repeats=_integer(1, MAX_REPEATS),
                temperature=_number(0.0, 2.0),
            ),
            "required": ["kind", "profile"],
            **({"allOf": model_rules} if model_rules else {}),
        },
        _kind("verifier", "Each row's `verifier` runs in its sandbox; its reward is the score."),
    ]
    chosen = [
        branch
        for branch in branches
        if kinds is None or branch["properties"]["kind"]["const"] in kinds
    ]
    return {"oneOf": chosen}


def _both_flags() -> dict[str, Any]:
    """`squad` lower-cases, so it cannot be `case_sensitive` too."""
    return {
        "required": ["case_sensitive", "squad"],
        "properties": {"case_sensitive": {"const": True}, "squad": {"const": True}},
    }
