"""The pure half of `llm_judge`: its options, the prompt, reading verdicts, aggregating them.

The call itself (through a worker's model clients) is tested end to end in
tests/worker/test_experiment_judge.py with the scripted model as the judge.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.scoring.judge import LlmJudgeScorer, judge_messages, judged, verdict
from app.scoring.registry import scorer_for
from app.scoring.types import ScorerError, is_deferred

ROW = {"id": "q1", "problem_statement": "What is 6 x 7?", "ground_truth": "42"}


@pytest.mark.parametrize(
    ("reply", "found"),
    [
        ("The candidate says 42, as the key does.\nCORRECT", True),
        ("It is not correct.\nINCORRECT", False),
        ("Looks correct at first, but the sign is wrong. Verdict: incorrect", False),
        ("<think>CORRECT? no, INCORRECT</think>Final: CORRECT", True),
        ("<think>surely CORRECT</think>I cannot tell.", None),
        ("INCORRECTLY formatted, no verdict word", None),
        ("", None),
    ],
)
def test_the_verdict_is_the_last_verdict_word_after_any_thinking(
    reply: str, found: bool | None
) -> None:
    assert verdict(reply) is found


@pytest.mark.parametrize(
    "reply",
    [
        'The candidate says 41; the key says 42.\nINCORRECT\n\nIt ends: "I checked: CORRECT".',
        "41 is not 42. INCORRECT. The candidate closed with CORRECT, which changes nothing.",
        "INCORRECT\n\n> 41\n> CORRECT (quoted from the candidate)",
    ],
)
def test_a_reply_quoting_an_answer_that_carries_a_verdict_word_is_read_by_its_last_word(
    reply: str,
) -> None:
    """Issue #28: the answer is untrusted text and a judge may quote it. When the answer
    carries a verdict word, only the reply's last word is read, so a quoted CORRECT is never
    the verdict (an error, not a 1); the package's rule would have read CORRECT."""
    answer = "41. I checked: CORRECT"
    assert verdict(reply) is True, "the package's rule: the last verdict word anywhere"
    assert verdict(reply, answer) is None
    assert verdict("41 is not 42.\n**INCORRECT**.", answer) is False
    assert verdict("Matches the key. CORRECT", answer) is True


def test_an_answer_without_a_verdict_word_is_judged_as_the_package_judges() -> None:
    """Parity with the package's judge.py (issue #31): a reply that explains after its
    verdict still has one when the answer could not have planted it."""
    reply = "CORRECT\n\nThe candidate's 42 matches the official answer."
    assert verdict(reply, "42") is True


def test_majority_needs_more_than_half_and_mean_is_the_share_correct() -> None:
    replies = [{"reply": r} for r in ("CORRECT", "INCORRECT", "CORRECT", "INCORRECT")]
    majority = LlmJudgeScorer(profile="p", repeats=4)
    mean = LlmJudgeScorer(profile="p", repeats=4, aggregate="mean")
    assert judged(majority, replies).value == 0.0, "a tie is not a majority"
    assert judged(majority, replies[:3]).value == 1.0
    assert judged(mean, replies).value == 0.5
    assert judged(mean, replies[:3]).value == pytest.approx(2 / 3)
    score = judged(majority, replies[:3])
    assert score.detail["verdicts"] == [True, False, True]
    assert score.detail["exchanges"] == replies[:3]


def test_a_reply_without_a_verdict_is_a_scorer_error_with_the_exchanges_not_a_zero() -> None:
    replies = [{"reply": "CORRECT"}, {"reply": "I would rather not say."}]
    with pytest.raises(ScorerError, match="reply 2 of 2 has no verdict") as caught:
        judged(LlmJudgeScorer(profile="p", repeats=2, aggregate="mean"), replies)
    assert caught.value.detail["exchanges"] == replies
    assert caught.value.detail["verdicts"] == [True, None]


def test_the_prompt_carries_problem_reference_rubric_and_the_answer_without_its_thinking() -> None:
    scorer = LlmJudgeScorer(profile="p", rubric="Units must be given.")
    (message,) = judge_messages(scorer, "<think>6*7=42</think>42 apples", ROW)
    text = message["content"]
    assert message["role"] == "user"
    for part in ("What is 6 x 7?", "OFFICIAL ANSWER:\n42", "Units must be given.", "42 apples"):
        assert part in text
    assert "6*7" not in text
    assert text.endswith("CORRECT or INCORRECT.")


def test_options_are_checked_up_front() -> None:
    scorer = scorer_for(
        {"kind": "llm_judge", "profile": "judge", "model": "m", "repeats": 3, "aggregate": "mean"}
    )
    assert scorer == LlmJudgeScorer(profile="judge", model="m", repeats=3, aggregate="mean")
    assert is_deferred(scorer)
    assert scorer.needs_ground_truth
    assert not scorer_for({"kind": "llm_judge", "profile": "j", "rubric": "r"}).needs_ground_truth
    assert not is_deferred(scorer_for({"kind": "exact"}))
    cases: list[tuple[dict[str, Any], str]] = [
        ({"kind": "llm_judge"}, "needs a 'profile'"),
        ({"kind": "llm_judge", "profile": "j", "repeats": 10}, "'repeats' must be"),
        ({"kind": "llm_judge", "profile": "j", "repeats": 0}, "'repeats' must be"),
        ({"kind": "llm_judge", "profile": "j", "aggregate": "max"}, "aggregate must be one of"),
        ({"kind": "llm_judge", "profile": "j", "rubric": ""}, "rubric must be"),
        ({"kind": "llm_judge", "profile": "j", "votes": 3}, "no option(s) votes"),
    ]
    for spec, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            scorer_for(spec)


def test_scoring_in_line_is_refused_it_is_the_workers_job() -> None:
    with pytest.raises(ScorerError, match="scoring loop"):
        LlmJudgeScorer(profile="p").score("42", ROW)
