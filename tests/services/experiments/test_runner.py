"""How an item ends from its task's end: scored, cancelled, or an error of the right kind.

`record_end` is pure (rows in memory): every kind of end, without running a task. A
built-in scorer's verdict comes in computed (the runner computes it off the event loop,
before its transaction), so here it is `score_answer`'s, in this process.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest

from app.db import models
from app.domain.scored_answer import scored_answer
from app.ids import utc_now
from app.scoring.registry import scorer_for
from app.scoring.types import Score, ScorerError, score_answer
from app.services.experiments.runner import record_end, verified

MATH = scorer_for({"kind": "math"})


ROW = {"id": "q1", "problem_statement": "p", "ground_truth": "4"}


def item() -> models.ExperimentItem:
    return models.ExperimentItem(
        experiment_id="exp_x", row_id="q1", arm="a", attempt=1, status="running", detail={}
    )


def task(status: str, reason: str, answer: str | None = None, **usage: int) -> models.Task:
    started = utc_now()
    return models.Task(
        id="tsk_x",
        status=status,
        finish_reason=reason,
        answer=answer,
        usage={"steps": 3, "prompt_tokens": 100, "completion_tokens": 7, **usage},
        started_at=started,
        finished_at=started + timedelta(seconds=2.5),
    )


def end(
    found: models.ExperimentItem,
    ended: models.Task | None,
    *,
    package: bool = False,
    sandbox: bool = True,
    row: Mapping[str, Any] = ROW,
) -> bool:
    """`record_end` as the runner calls it: the rules' text to score, scored off the loop."""
    to_score = None
    if ended is not None:
        to_score = scored_answer(
            ended.status, ended.finish_reason, ended.answer, package=package, sandbox=sandbox
        )
    verdict: Score | ScorerError | None = None
    if to_score is not None:
        try:
            verdict = score_answer(MATH, to_score, row)
        except ScorerError as exc:
            verdict = exc
    return record_end(found, ended, MATH, verdict, to_score=to_score)


@pytest.mark.parametrize(
    ("ended", "status", "score", "kind"),
    [
        (task("succeeded", "submitted", "\\boxed{4}"), "scored", 1.0, None),
        (task("succeeded", "submitted", "\\boxed{5}"), "scored", 0.0, None),
        (task("succeeded", "submitted", None), "error", None, "agent"),
        (task("failed", "max_steps"), "error", None, "agent"),
        (task("failed", "context_limit"), "error", None, "agent"),
        (task("failed", "timeout"), "error", None, "agent"),
        (task("failed", "sandbox_error"), "error", None, "infrastructure"),
        (task("failed", "llm_error"), "error", None, "infrastructure"),
        (task("failed", "worker_lost"), "error", None, "infrastructure"),
        (task("cancelled", "cancelled"), "cancelled", None, None),
        (None, "error", None, "infrastructure"),
    ],
)
def test_an_item_ends_as_its_task_did(
    ended: models.Task | None, status: str, score: float | None, kind: str | None
) -> None:
    found = item()
    assert end(found, ended)
    assert (found.status, found.score, found.error_kind) == (status, score, kind)
    if ended is not None:
        assert (found.steps, found.prompt_tokens, found.completion_tokens) == (3, 100, 7)
        assert found.seconds == pytest.approx(2.5)
        assert found.answer == ended.answer


@pytest.mark.parametrize(
    ("ended", "sandbox", "status", "score", "kind", "answer"),
    [
        (task("succeeded", "submitted", "\\boxed{4}"), True, "scored", 1.0, None, "\\boxed{4}"),
        # the package strips what `cat answer.txt` printed, colour codes and \r dropped
        (task("succeeded", "submitted", " \x1b[1m4\x1b[0m\r\n"), True, "scored", 1.0, None, "4"),
        # a vanilla reply is scored whole, as the package scores message.content
        (task("succeeded", "submitted", " 4\n"), False, "scored", 1.0, None, " 4\n"),
        # no answer, or the agent's budget ran out: the answer it left, or "", is scored
        (task("succeeded", "submitted", None), True, "scored", 0.0, None, ""),
        (task("failed", "max_steps", "4\n"), True, "scored", 1.0, None, "4"),
        (task("failed", "context_limit"), True, "scored", 0.0, None, ""),
        (task("failed", "timeout"), False, "scored", 0.0, None, ""),
        # the service's failures are still not scored
        (task("failed", "sandbox_error", "4"), True, "error", None, "infrastructure", "4"),
        (task("failed", "worker_lost"), True, "error", None, "infrastructure", None),
        (task("cancelled", "cancelled", "4"), True, "cancelled", None, None, "4"),
    ],
)
def test_under_the_package_rules_an_item_is_scored_as_the_package_scores_it(
    ended: models.Task,
    sandbox: bool,
    status: str,
    score: float | None,
    kind: str | None,
    answer: str | None,
) -> None:
    found = item()
    assert end(found, ended, package=True, sandbox=sandbox)
    assert (found.status, found.score, found.error_kind) == (status, score, kind)
    assert found.answer == answer


def test_a_scorer_that_cannot_judge_is_an_error_of_kind_scorer_not_a_zero() -> None:
    found = item()
    ended = task("succeeded", "submitted", "\\boxed{4}")
    assert end(found, ended, row={**ROW, "ground_truth": {"not": "a number"}})
    assert (found.status, found.score, found.error_kind) == ("error", None, "scorer")
    assert "ground_truth" in found.detail["message"]


def test_an_answer_not_scored_yet_is_left_running_untouched() -> None:
    """Its task ended after the runner scored the batch off the loop: the next step does."""
    found = item()
    ended = task("succeeded", "submitted", "\\boxed{4}")
    assert not record_end(found, ended, MATH, None, to_score=ended.answer)
    assert (found.status, found.answer, found.steps) == ("running", None, None)


VERIFIER = scorer_for({"kind": "verifier"})


def verified_end(ended: models.Task, *, retries: int = 0) -> models.ExperimentItem:
    """`record_end` as the runner calls it for the `verifier` scorer."""
    found = item()
    text, score, lost = verified(ended)
    assert record_end(found, ended, VERIFIER, score, to_score=text, retries=retries, lost=lost)
    return found


def test_a_verifier_scores_the_tasks_reward_and_a_verifier_the_service_lost_is_retried() -> None:
    ran = task("succeeded", "submitted", "41")
    ran.verification = {"reward": 0.0, "rewards": {"reward": 0.0}, "infrastructure": False}
    scored = verified_end(ran)
    assert (scored.status, scored.score, scored.answer) == ("scored", 0.0, "41")

    budget = task("failed", "max_steps")  # the agent's budget ran out: still verified
    budget.verification = {"reward": 1.0, "rewards": {"reward": 1.0}, "infrastructure": False}
    assert (verified_end(budget).status, verified_end(budget).score) == ("scored", 1.0)

    lost = task("succeeded", "submitted", "42")
    lost.verification = {
        "reward": None,
        "error": "the verifier's sandbox failed: gone",
        "infrastructure": True,
    }
    again = verified_end(lost, retries=1)
    assert (again.status, again.retries, again.task_id) == ("pending", 1, None)
    spent = verified_end(lost, retries=0)
    assert (spent.status, spent.error_kind, spent.score) == ("error", "infrastructure", None)
    assert "sandbox failed: gone" in spent.detail["message"]

    unverified = verified_end(task("failed", "llm_error"))  # no verification: the task's own end
    assert (unverified.status, unverified.error_kind) == ("error", "infrastructure")
