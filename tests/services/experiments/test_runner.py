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
from app.ids import utc_now
from app.scoring.registry import scorer_for
from app.scoring.types import Score, ScorerError, score_answer
from app.services.experiments.runner import record_end

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


def verdict(ended: models.Task | None, row: Mapping[str, Any] = ROW) -> Score | ScorerError | None:
    if ended is None or ended.answer is None:
        return None
    try:
        return score_answer(MATH, ended.answer, row)
    except ScorerError as exc:
        return exc


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
    assert record_end(found, ended, MATH, verdict(ended))
    assert (found.status, found.score, found.error_kind) == (status, score, kind)
    if ended is not None:
        assert (found.steps, found.prompt_tokens, found.completion_tokens) == (3, 100, 7)
        assert found.seconds == pytest.approx(2.5)
        assert found.answer == ended.answer


def test_a_scorer_that_cannot_judge_is_an_error_of_kind_scorer_not_a_zero() -> None:
    found = item()
    ended = task("succeeded", "submitted", "\\boxed{4}")
    assert record_end(
        found, ended, MATH, verdict(ended, {**ROW, "ground_truth": {"not": "a number"}})
    )
    assert (found.status, found.score, found.error_kind) == ("error", None, "scorer")
    assert "ground_truth" in found.detail["message"]


def test_an_answer_not_scored_yet_is_left_running_untouched() -> None:
    """Its task ended after the runner scored the batch off the loop: the next step does."""
    found = item()
    assert not record_end(found, task("succeeded", "submitted", "\\boxed{4}"), MATH)
    assert (found.status, found.answer, found.steps) == ("running", None, None)
