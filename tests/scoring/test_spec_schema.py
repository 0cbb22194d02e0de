"""The scorer spec's JSON Schema (`app.scoring.spec_schema`) and the registry agree: a spec the
schema admits is built, one it rejects is refused, except for the three rules the schema
leaves to the registry (python code that parses, a regex that compiles, mcq letters that do
not repeat). tests/security/test_fuzz.py draws specs from the schema at random."""

from __future__ import annotations

from typing import Any

import jsonschema_rs
import pytest

from app.scoring.python_code import PythonLimits
from app.scoring.registry import scorer_for
from app.scoring.spec_schema import scorer_schema

LIMITS = PythonLimits()
PROFILES = ["default", "judge"]
RULES = [
    {
        "if": {"required": ["profile"], "properties": {"profile": {"const": "judge"}}},
        "then": {"properties": {"model": {"enum": ["big", "small"]}}},
    }
]
SCHEMA = scorer_schema(LIMITS, PROFILES, RULES)
CODE = "def compute_score(agent_answer, ground_truth, **row):\n    return 1.0\n"


def builds(spec: dict[str, Any]) -> bool:
    try:
        scorer_for(spec, python_limits=LIMITS)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "math"},
        {"kind": "math", "tolerance": 0.1, "timeout_s": 60, "package": False},
        {"kind": "math", "package": True},
        {"kind": "mcq", "choices": "abcd"},
        {"kind": "mcq", "package": True},
        {"kind": "exact", "case_sensitive": True},
        {"kind": "contains", "squad": True},
        {"kind": "regex", "pattern": "4[0-9]", "flags": "im", "fullmatch": True},
        {"kind": "regex", "pattern": None, "flags": None},
        {"kind": "f1"},
        {"kind": "rouge_l", "use_stemmer": True},
        {"kind": "instruction_following", "loose": True},
        {"kind": "python", "code": CODE, "timeout_s": 5, "memory_mb": 64, "output_bytes": 1024},
        {"kind": "llm_judge", "profile": "default", "repeats": 3, "aggregate": "mean"},
        {"kind": "verifier"},
    ],
)
def test_what_the_schema_admits_the_registry_builds(spec: dict[str, Any]) -> None:
    assert jsonschema_rs.is_valid(SCHEMA, spec), spec
    assert builds(spec), spec


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"kind": "nope"},
        {"kind": "math", "package": True, "tolerance": 0.1},  # the package's rule has none
        {"kind": "math", "tolerance": 0.6},
        {"kind": "math", "timeout_s": 0},
        {"kind": "math", "extra": 1},
        {"kind": "mcq", "choices": "A"},
        {"kind": "mcq", "choices": None},
        {"kind": "exact", "case_sensitive": True, "squad": True},
        {"kind": "exact", "squad": 1},
        {"kind": "regex", "flags": "q"},
        {"kind": "regex", "pattern": ""},
        {"kind": "python"},
        {"kind": "python", "code": CODE, "timeout_s": LIMITS.max_timeout_s + 1},
        {"kind": "python", "code": CODE, "memory_mb": 63},
        {"kind": "llm_judge"},
        {"kind": "llm_judge", "profile": "elsewhere"},
        {"kind": "llm_judge", "profile": "default", "model": "  "},
        {"kind": "llm_judge", "profile": "default", "aggregate": "max"},
        {"kind": "llm_judge", "profile": "default", "repeats": 0},
        {"kind": "llm_judge", "profile": "default", "rubric": " "},
        {"kind": "verifier", "files": {}},
    ],
)
def test_what_the_schema_rejects_the_registry_refuses(spec: dict[str, Any]) -> None:
    assert not jsonschema_rs.is_valid(SCHEMA, spec), spec
    if spec.get("kind") == "llm_judge" and spec.get("profile") == "elsewhere":
        return  # the registry builds it; the profile is checked against the server's
    assert not builds(spec), spec


def test_a_profiles_models_are_said_per_profile() -> None:
    assert jsonschema_rs.is_valid(SCHEMA, {"kind": "llm_judge", "profile": "judge", "model": "big"})
    assert not jsonschema_rs.is_valid(
        SCHEMA, {"kind": "llm_judge", "profile": "judge", "model": "huge"}
    )
    assert jsonschema_rs.is_valid(
        SCHEMA, {"kind": "llm_judge", "profile": "default", "model": "huge"}
    )


def test_a_regrade_takes_only_the_kinds_it_is_given() -> None:
    regrade = scorer_schema(LIMITS, PROFILES, RULES, kinds={"exact", "math"})
    assert jsonschema_rs.is_valid(regrade, {"kind": "exact"})
    assert not jsonschema_rs.is_valid(regrade, {"kind": "verifier"})
