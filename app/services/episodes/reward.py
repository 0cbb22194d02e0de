"""An ended episode's reward: its scorer on its answer, 0 with the reason when there is none.

An episode the infrastructure ended (`worker_lost`, `sandbox_error`, `worker_stopped`: its
row's `error_kind` is `infrastructure`) is not scored at all: 409 with that `error_kind`,
never the 0 of an episode that did not submit.

A built-in scorer runs here, on each call. A deferred one (`llm_judge`, `python`) cannot
run in the API: the worker that held the episode runs it when the loop ends, before it
answers the final step (`app.worker.episodes.reward`), and stores the result in the row's
`reward` (`stored`), which this reads. A failed scoring is an error answer (409 with the
`error_kind`), never a 0. No result yet: 409 pending while the worker's scoring lease
(`app.bus.episodes.scoring`) is held; with it gone, twice, the infrastructure error is
stored (`store_lost`, also used by the worker's episode sweep).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from app.bus import episodes as bus
from app.bus import leases
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.errors import Conflict
from app.schemas.episodes import RewardOut
from app.scoring.offload import score_off_loop
from app.scoring.types import Score, ScorerError, is_deferred
from app.services.episodes import service as rows
from app.services.experiments.scoring import stored_scorer

SCORER = "scorer"
INFRASTRUCTURE = rows.INFRASTRUCTURE


def scorer_row(row_id: str, prompt: str, ground_truth: Any) -> dict[str, Any]:
    """What a scorer gets as the dataset row an experiment would give it: the episode's
    id, its prompt as `problem_statement`, and its `ground_truth`."""
    return {"id": row_id, "problem_statement": prompt, "ground_truth": ground_truth}


def stored(kind: str, found: Score | ScorerError, error_kind: str = SCORER) -> dict[str, Any]:
    """The `reward` column's value: the score and its detail (the judge's exchanges, the
    code's output), or the error, its kind (`scorer`, `infrastructure`) and its detail."""
    if isinstance(found, Score):
        return {"scorer": kind, "score": found.value, "detail": found.detail, "error_kind": None}
    return {
        "scorer": kind,
        "score": None,
        "error": found.message,
        "error_kind": error_kind,
        "detail": found.detail,
    }


async def reward(
    sessions: Sessions, redis: Redis, settings: Settings, row: models.EpisodeRow
) -> RewardOut:
    """Conflict while it still runs or when it has no scorer; never a 0 for a scorer error."""
    if row.status in rows.ACTIVE:
        raise Conflict("the episode has not ended yet: step it to the end or delete it first")
    if row.scorer is None:
        raise Conflict("the episode was created without a scorer")
    try:
        scorer = stored_scorer(row.scorer, settings)
    except ValueError as exc:
        raise _failed(stored(str(row.scorer.get("kind")), ScorerError(str(exc)))) from exc
    base = {"scorer": scorer.kind, "finish_reason": row.finish_reason}
    if row.error_kind == INFRASTRUCTURE:
        # Not the policy's doing (its worker was lost or stopped, its sandbox failed): no
        # reward at all, rather than a 0 the trainer would learn from.
        raise Conflict(
            f"not scored: the episode was ended by the infrastructure ({row.finish_reason})",
            details={"error_kind": INFRASTRUCTURE, "finish_reason": row.finish_reason},
        )
    zero = _zero_why(row)
    if zero is not None:
        return RewardOut(score=0.0, reason=zero, **base)
    if is_deferred(scorer):
        result = row.reward or await _unscored(sessions, redis, settings, row, scorer.kind)
        if result.get("error_kind") is not None:
            raise _failed(result)
        return RewardOut(score=result["score"], detail=result.get("detail") or {}, **base)
    try:
        truth = {"ground_truth": row.ground_truth}
        score = await score_off_loop(scorer, row.answer, truth, settings)
    except ScorerError as exc:
        raise _failed(stored(scorer.kind, exc)) from exc
    return RewardOut(score=score.value, detail=score.detail, **base)


def _zero_why(row: models.EpisodeRow) -> str | None:
    """Why the episode scores 0 without its scorer: it never submitted (the paper's rule
    for overlong episodes, unless it asked for its answer file to be scored), or there is
    no answer file; None when its answer is to be scored."""
    submitted = row.finish_reason == "submitted"
    if not submitted and row.spec.get("unsubmitted") != "answer_file":
        return f"never submitted ({row.finish_reason})"
    if row.answer is None:
        if submitted:
            return "submitted without an answer file"
        return f"no answer file (never submitted: {row.finish_reason})"
    return None


async def _unscored(
    sessions: Sessions, redis: Redis, settings: Settings, row: models.EpisodeRow, kind: str
) -> dict[str, Any]:
    """No result yet: a worker still scores it while its scoring lease is held (409
    pending); with the lease gone, looked at twice a heartbeat period apart (a Redis that
    just lost its keys must not fail a live scoring), nobody will store one: the
    infrastructure error is then the stored result."""
    gone = await leases.missing_twice(
        lambda ids: bus.scoring(redis, ids), [row.id], settings.worker_heartbeat_s
    )
    if not gone:
        raise _pending(kind)
    await store_lost(sessions, row.id, kind, f"its worker {row.worker} was lost before it scored")
    fresh = await rows.find(sessions, row.tenant_id, row.id)
    assert fresh.reward is not None
    return fresh.reward


async def store_lost(sessions: Sessions, episode_id: str, kind: str, why: str) -> bool:
    """Store that nobody will score the episode (kind `infrastructure`); False when a
    result was stored meanwhile (the worker's stands)."""
    lost = ScorerError(f"infrastructure: {why}")
    return await rows.record_reward(sessions, episode_id, stored(kind, lost, INFRASTRUCTURE))


def _pending(kind: str) -> Conflict:
    return Conflict(
        "the episode's scorer is still running: its final step answers once it is done",
        details={"reward": "pending", "scorer": kind},
    )


def _failed(result: dict[str, Any]) -> Conflict:
    """The error answer of a failed scoring, its detail (the judge's exchanges, the code's
    stdout and stderr) kept for debugging."""
    kind = result.get("error_kind") or SCORER
    return Conflict(
        f"the scorer failed: {result.get('error')}",
        details={**(result.get("detail") or {}), "error_kind": kind, "scorer": result["scorer"]},
    )
