"""An ended episode's reward: its scorer on its answer, 0 with the reason when there is none."""

from __future__ import annotations

from app.db import models
from app.episode_schemas import RewardOut
from app.errors import Conflict
from app.scoring.registry import scorer_for
from app.scoring.types import ScorerError, score_answer


def reward(row: models.EpisodeRow) -> RewardOut:
    """Conflict while it still runs or when it has no scorer; never a 0 for a scorer error."""
    if row.status in ("opening", "open"):
        raise Conflict("the episode has not ended yet: step it to the end or delete it first")
    if row.scorer is None:
        raise Conflict("the episode was created without a scorer")
    scorer = scorer_for(row.scorer)
    base = {"scorer": scorer.kind, "finish_reason": row.finish_reason}
    if row.finish_reason != "submitted":
        # The paper's rule: an episode that never submitted (overlong, cut) scores 0.
        return RewardOut(score=0.0, reason=f"never submitted ({row.finish_reason})", **base)
    if row.answer is None:
        return RewardOut(score=0.0, reason="submitted without an answer file", **base)
    try:
        score = score_answer(scorer, row.answer, {"ground_truth": row.ground_truth})
    except ScorerError as exc:
        raise Conflict(f"the scorer failed: {exc}", details=exc.detail) from exc
    return RewardOut(score=score.value, detail=score.detail, **base)
