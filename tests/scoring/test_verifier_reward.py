"""How a verifier's reward file becomes a reward (Harbor's reading: reward.json first, finite
numbers only), and how a verification becomes an item's score or why there is none."""

from __future__ import annotations

import pytest

from app.runner.verifier import parse_reward
from app.scoring.types import Score, ScorerError, ScoringFailed
from app.scoring.verifier import VerifierScorer, verdict


@pytest.mark.parametrize(
    ("report", "reward", "rewards", "error"),
    [
        ("txt\n1\n", 1.0, {"reward": 1.0}, None),
        ("txt\n 0.25 ", 0.25, {"reward": 0.25}, None),
        ('json\n{"reward": 0.5, "style": 1}', 0.5, {"reward": 0.5, "style": 1.0}, None),
        ('json\n{"passed": 1}', 1.0, {"passed": 1.0}, None),
        ('json\n{"a": 1, "b": 0}', None, {"a": 1.0, "b": 0.0}, "several rewards"),
        ('json\n{"reward": true}', None, {}, "not a number"),
        ('json\n{"reward": "1"}', None, {}, "not a number"),
        ('json\n{"reward": NaN}', None, {}, "not finite"),
        ("json\n[1]", None, {}, "must be an object"),
        ("json\nnope", None, {}, "not JSON"),
        ("txt\nyes", None, {}, "not a number"),
        ("txt\ninf", None, {}, "not finite"),
        ('json\n{"reward": 1' + "0" * 400 + "}", None, {}, "too large"),
        ("link reward.json\n", None, {}, "symbolic link"),
        ("empty\n", None, {}, "empty"),
        ("none\n", None, {}, "no reward file"),
    ],
)
def test_reward_files_read_as_harbor_reads_them(
    report: str, reward: float | None, rewards: dict[str, float], error: str | None
) -> None:
    found = parse_reward(report)
    assert (found.reward, found.rewards) == (reward, rewards)
    assert (found.error is None) if error is None else (error in (found.error or ""))


def test_a_verification_becomes_a_score_or_says_why_not() -> None:
    ran = {"reward": 1.0, "rewards": {"reward": 1.0}, "exit_code": 0, "infrastructure": False}
    assert verdict(ran) == Score(1.0, ran)
    with pytest.raises(ScorerError, match="outside") as outside:
        verdict({**ran, "reward": 3.0})
    assert outside.value.kind == "scorer"
    missing = verdict({**ran, "reward": None, "error": "no reward file: ..."})
    assert missing.value == 0.0, "in the agent's own sandbox: the agent's 0"
    assert "no reward file" in missing.detail["message"]
    with pytest.raises(ScoringFailed, match="sandbox failed") as lost:
        verdict({"reward": None, "error": "the verifier's sandbox failed", "infrastructure": True})
    assert lost.value.kind == "infrastructure", "the service's failure is never a 0"
    with pytest.raises(ScoringFailed):
        verdict(None)


def test_the_verifier_scorer_needs_each_rows_tests_and_scores_no_answer() -> None:
    scorer = VerifierScorer()
    scorer.validate_row({"verifier": {"files": {"test.sh": "exit 0"}, "timeout_s": 5}})
    for row, words in (
        ({}, "needs the row's verifier"),
        ({"verifier": {"files": {}}}, "map paths"),
        ({"verifier": {"files": {"test.sh": 1}}}, "map paths"),
        ({"verifier": {"files": {"test.sh": ""}, "env": {}}}, "unknown option 'env'"),
    ):
        with pytest.raises(ValueError, match=words):
            scorer.validate_row(row)
    with pytest.raises(ScorerError, match="own sandbox"):
        scorer.score("42", {})
