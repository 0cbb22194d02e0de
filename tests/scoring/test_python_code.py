"""The `python` scorer's spec checked up-front (`scorer_for`): a bad one never reaches a sandbox."""

from __future__ import annotations

import pytest

from app.config import Settings
from app.scoring.python_code import PythonLimits, PythonScorer
from app.scoring.registry import scorer_for, scorer_kinds
from app.scoring.types import ScorerError, is_deferred, score_answer

GOOD = "def compute_score(agent_answer, ground_truth, **row):\n    return 1.0\n"


def test_a_good_spec_builds_a_deferred_scorer_with_the_defaults() -> None:
    assert "python" in scorer_kinds()
    scorer = scorer_for({"kind": "python", "code": GOOD})
    assert scorer == PythonScorer(code=GOOD, timeout_s=30, memory_mb=256, output_bytes=65536)
    assert scorer.kind == "python"
    assert scorer.needs_ground_truth is False
    assert is_deferred(scorer)


def test_options_reach_the_scorer() -> None:
    spec = {"kind": "python", "code": GOOD, "timeout_s": 5, "memory_mb": 128, "output_bytes": 4096}
    scorer = scorer_for(spec)
    assert isinstance(scorer, PythonScorer)
    assert (scorer.timeout_s, scorer.memory_mb, scorer.output_bytes) == (5, 128, 4096)


def test_it_never_runs_in_process() -> None:
    scorer = scorer_for({"kind": "python", "code": GOOD})
    with pytest.raises(ScorerError, match="runs in a sandbox"):
        score_answer(scorer, "42", {"ground_truth": "42"})


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (None, "option 'code' must be Python source"),
        ("", "option 'code' must be Python source"),
        (42, "option 'code' must be Python source"),
        ("def compute_score(a, g, **row)\n    return 1\n", r"does not parse \(line 1"),
        ("x = 1\0\n", "does not parse"),
        ("def score(agent_answer, ground_truth, **row):\n    return 1\n", "must define"),
        ("def outer():\n    def compute_score(a, g):\n        return 1\n", "must define"),
        ("async def compute_score(a, g, **row):\n    return 1\n", "must define"),
    ],
)
def test_bad_code_is_refused_with_a_clear_message(code: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        scorer_for({"kind": "python", "code": code})


def test_other_ways_of_defining_compute_score_are_accepted() -> None:
    assigned = "def _f(a, g, **row):\n    return 0.5\ncompute_score = _f\n"
    assert isinstance(scorer_for({"kind": "python", "code": assigned}), PythonScorer)
    imported = "from math import floor as compute_score\n"
    assert isinstance(scorer_for({"kind": "python", "code": imported}), PythonScorer)


def test_code_past_the_size_limit_is_refused() -> None:
    limits = PythonLimits(code_max_bytes=100)
    big = GOOD + "#" * 100
    with pytest.raises(ValueError, match=r"code is \d+ bytes, more than 100"):
        scorer_for({"kind": "python", "code": big}, python_limits=limits)
    # the same code is fine under the built-in limit
    assert isinstance(scorer_for({"kind": "python", "code": big}), PythonScorer)
    # bytes, not characters
    wide = "def compute_score(a, g, **row):\n    return 1  # " + "é" * 30 + "\n"
    assert len(wide) < 100 < len(wide.encode())
    with pytest.raises(ValueError, match="more than 100"):
        scorer_for({"kind": "python", "code": wide}, python_limits=limits)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("timeout_s", 0, "'timeout_s' must be a whole number from 1 to 300"),
        ("timeout_s", 301, "'timeout_s' must be a whole number from 1 to 300"),
        ("timeout_s", 1.5, "'timeout_s' must be a whole number"),
        ("timeout_s", True, "'timeout_s' must be a whole number"),
        ("memory_mb", 16, "'memory_mb' must be a whole number from 64 to 4096"),
        ("memory_mb", 5000, "'memory_mb' must be a whole number from 64 to 4096"),
        ("output_bytes", 10, "'output_bytes' must be a whole number from 1024 to 4194304"),
        ("output_bytes", "64k", "'output_bytes' must be a whole number"),
    ],
)
def test_options_out_of_range_are_refused(option: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        scorer_for({"kind": "python", "code": GOOD, option: value})


def test_unknown_options_are_refused() -> None:
    with pytest.raises(ValueError, match=r"scorer 'python' has no option\(s\) pids_limit"):
        scorer_for({"kind": "python", "code": GOOD, "pids_limit": 10_000})


def test_the_servers_settings_set_the_defaults_and_maxima() -> None:
    settings = Settings(
        experiment_python_scorer_timeout_s=10,
        experiment_python_scorer_max_timeout_s=20,
        experiment_python_scorer_memory_mb=128,
        experiment_python_scorer_pids_limit=32,
        experiment_python_scorer_scratch_mb=8,
    )
    limits = PythonLimits.from_settings(settings)
    scorer = scorer_for({"kind": "python", "code": GOOD}, python_limits=limits)
    assert isinstance(scorer, PythonScorer)
    assert (scorer.timeout_s, scorer.memory_mb, scorer.pids_limit, scorer.scratch_mb) == (
        10,
        128,
        32,
        8,
    )
    with pytest.raises(ValueError, match="from 1 to 20"):
        scorer_for({"kind": "python", "code": GOOD, "timeout_s": 21}, python_limits=limits)


def test_a_default_above_its_maximum_is_a_settings_error() -> None:
    with pytest.raises(ValueError, match="must not exceed experiment_python_scorer_max_timeout_s"):
        Settings(experiment_python_scorer_timeout_s=60, experiment_python_scorer_max_timeout_s=30)


@pytest.mark.parametrize(
    "body",
    ["1+" * 60_000 + "1", "-" * 100_000 + "1"],
    ids=["60000 terms", "100000 minus signs"],
)
def test_code_nested_too_deeply_to_parse_is_refused_not_a_crash(body: str) -> None:
    code = f"def compute_score(agent_answer, ground_truth, **row):\n    return {body}\n"
    with pytest.raises(ValueError, match="scorer 'python': code"):
        scorer_for({"kind": "python", "code": code})
