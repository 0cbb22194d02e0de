"""An ended episode's deferred scorer (`llm_judge`, `python`), run by the worker that held it.

The API cannot run these (it never calls a model or starts a container), so the episode
server calls `score_ended` once the loop ended and the row says so, before it answers the
final step: by the time a trainer has that answer, `POST /v1/episodes/{id}/reward` reads
the stored result. Scoring is the experiments' (`app.worker.scoring.score_with`: the
judge through the Runner's model clients, `compute_score` in a fresh hardened sandbox),
bounded by `experiment_scoring_timeout_s`; it holds only its own episode's lock, so other
episodes step meanwhile. Every outcome is stored once (`services.episodes.record_reward`):
the score, the scorer's error (kind `scorer`), or the worker's own failure (Docker
unreachable, the worker stopping: kind `infrastructure`), never a silent 0.

While it may still store that result, the worker holds the episode's scoring lease
(`scoring_lease`: set before the row says the episode ended, renewed every heartbeat,
deleted once the reward is stored or could not be); the API and the sweep store the
infrastructure error for a submitted answer with neither a reward nor a lease.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.bus import episodes as bus
from app.config import Settings
from app.db.engine import Sessions
from app.kit import cancelling
from app.scoring.types import Score, ScorerError, is_deferred
from app.services.episodes import service as rows
from app.services.episodes.reward import INFRASTRUCTURE, SCORER, scorer_row, stored
from app.services.episodes.service import Opening
from app.services.experiments.scoring import stored_scorer
from app.worker.context import WorkerContext
from app.worker.scoring import RELEASE_WAIT_S, RETRIED_ERRORS, score_with

log = logging.getLogger(__name__)
STORE_ATTEMPTS = 4
STORE_BACKOFF_S = 0.25
"""The first retry's wait to store a reward; doubled at each further one (0.25, 0.5, 1 s)."""


def needs_scoring(
    settings: Settings,
    opening: Opening,
    finish_reason: str,
    answer: str | None,
    error_kind: str | None = None,
) -> bool:
    """Whether the worker scores this ending: a deferred scorer and an answer the episode's
    rule scores (`Opening.scores`; an episode that never submitted scores 0 in the API,
    without its scorer, unless it asked for its answer file to be scored)."""
    if opening.scorer is None or answer is None or not opening.scores(finish_reason, error_kind):
        return False
    try:
        return is_deferred(stored_scorer(opening.scorer, settings))
    except ValueError:  # no longer builds: `score_ended` stores that as the scorer's error
        return True


async def score_ended(ctx: WorkerContext, opening: Opening, answer: str) -> None:
    """Score the submitted answer and store the result; never raises but a cancellation
    (after storing that the worker stopped)."""
    assert opening.scorer is not None
    kind = str(opening.scorer.get("kind"))
    try:
        found, error_kind = await _score(ctx, opening, answer)
    except asyncio.CancelledError:
        stopped = ScorerError("infrastructure: the worker stopped while it scored")
        await _store_shielded(ctx, opening.id, stored(kind, stopped, INFRASTRUCTURE))
        raise
    await _store(ctx, opening.id, stored(kind, found, error_kind))


async def _score(
    ctx: WorkerContext, opening: Opening, answer: str
) -> tuple[Score | ScorerError, str]:
    assert opening.scorer is not None
    try:
        scorer = stored_scorer(opening.scorer, ctx.settings)
    except ValueError as exc:  # checked at open; this version cannot build it any more
        return ScorerError(f"the episode's scorer cannot be built any more: {exc}"), SCORER
    row = scorer_row(opening.id, opening.prompt, opening.ground_truth)
    try:
        found = await score_with(ctx, scorer, answer, row)
    except RETRIED_ERRORS as exc:  # no second try: the trainer masks it out of the loss
        log.warning("episode %s: scoring failed on this worker: %r", opening.id, exc)
        why = f"infrastructure: the worker could not run the scorer: {type(exc).__name__}: {exc}"
        return ScorerError(why[:1000]), INFRASTRUCTURE
    # A judge out of reach is the infrastructure's failure (JudgeUnavailable), as above.
    return found, found.kind if isinstance(found, ScorerError) else SCORER


async def _store(ctx: WorkerContext, episode_id: str, reward: dict[str, Any]) -> None:
    await store_reward(ctx.sessions, ctx.redis, episode_id, reward)


async def store_reward(
    sessions: Sessions, redis: Redis, episode_id: str, reward: dict[str, Any]
) -> bool:
    """Store the reward, retried a few times a short while apart (Postgres restarting,
    a failover); False when it never could: the scoring lease is then dropped at once, so
    the API (or the sweep) stores the infrastructure error instead of answering "pending"."""
    for attempt in range(STORE_ATTEMPTS):
        try:
            await rows.record_reward(sessions, episode_id, reward)
        except Exception as exc:
            log.warning(
                "episode %s: could not store its reward (try %d): %r", episode_id, attempt + 1, exc
            )
            if attempt + 1 < STORE_ATTEMPTS:
                await asyncio.sleep(STORE_BACKOFF_S * 2**attempt)
            continue
        return True
    log.error("episode %s: its reward was not stored; dropping its scoring lease", episode_id)
    await _drop(redis, episode_id)
    return False


async def _store_shielded(ctx: WorkerContext, episode_id: str, reward: dict[str, Any]) -> None:
    """Store while being cancelled (best effort: the API, finding no result and no scoring
    lease, stores the infrastructure error itself)."""
    storing = asyncio.ensure_future(_store(ctx, episode_id, reward))
    with suppress(BaseException):
        await asyncio.wait_for(asyncio.shield(storing), RELEASE_WAIT_S)


@asynccontextmanager
async def scoring_lease(ctx: WorkerContext, episode_id: str) -> AsyncIterator[None]:
    """Hold the episode's scoring lease for the block: set at once, renewed three times a
    lease (a TTL of `worker_lease_s`: a killed worker's lapses), deleted at the end."""
    await _hold(ctx, episode_id)
    renewing = asyncio.create_task(_renew(ctx, episode_id))
    try:
        yield
    finally:
        try:
            await cancelling.stop([renewing])  # ended for good: no renewal after the delete
        finally:
            await _drop(ctx.redis, episode_id)


async def _renew(ctx: WorkerContext, episode_id: str) -> None:
    """A third of the lease apart: two renewals may fail before it lapses."""
    while True:
        await asyncio.sleep(ctx.settings.worker_lease_s / 3)
        await _hold(ctx, episode_id)


async def _hold(ctx: WorkerContext, episode_id: str) -> None:
    try:
        await bus.hold_scoring(ctx.redis, episode_id, ctx.name, ctx.settings.worker_lease_s)
    except (RedisError, OSError) as exc:  # renewed again in a heartbeat period
        log.warning("episode %s: could not renew its scoring lease: %r", episode_id, exc)


async def _drop(redis: Redis, episode_id: str) -> None:
    try:
        await bus.drop_scoring(redis, episode_id)
    except (RedisError, OSError) as exc:  # it lapses by itself
        log.warning("episode %s: could not drop its scoring lease: %r", episode_id, exc)
