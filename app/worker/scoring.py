"""The worker's scoring loop: answers waiting for a slow scorer, scored outside Postgres.

A chore next to `experiments` (every `experiment_tick_s`). Each run claims up to
`experiment_scoring_concurrency` items in `scoring` under a lease of the scoring timeout
plus a margin (`services.experiment_scoring.claim`, SKIP LOCKED, so two workers never take
the same item), scores them at once with no transaction open, each within
`experiment_scoring_timeout_s`, and writes each score only if the lease is still this
worker's. A worker stopped mid-scoring gives its leases back (shielded from the
cancellation), so another worker takes them at once; one killed costs a lease: another
worker scores those items again once it expires, and the score is stored once. Each claim
is counted, so an answer whose scoring never comes back (it kills its worker every time,
Docker stays unreachable) ends a scorer error after `experiment_scoring_max_claims`.
A judge out of reach (`JudgeUnavailable`: no connection, 429, 5xx) is tried again the same
way while the item's claims stay within the experiment's `infrastructure_retries`; then it
ends not scored (`infrastructure`). Anything else a scorer raises is that item's scorer
error at once, never a retry.

Dispatch by the scorer's kind: `llm_judge` through the Runner's model clients
(`app.worker.judge`), `python` in a fresh sandbox on this worker's Docker host
(`app.sandbox.python_scorer.score`); a built-in scorer (after a regrade) in a process of
`app.scoring.offload`'s pool. `score_with`
is that dispatch for one answer, also used for episodes' rewards.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

from aiodocker.exceptions import DockerError
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app import metrics
from app.errors import SandboxError
from app.sandbox.python_scorer.score import score_in_sandbox
from app.sandbox.reaper import INSTANCE_LABEL, WORKER_LABEL
from app.scoring.judge import LlmJudgeScorer
from app.scoring.offload import score_off_loop
from app.scoring.python_code import PythonScorer
from app.scoring.types import JudgeUnavailable, Score, Scorer, ScorerError, ScoringFailed
from app.services.experiments import scoring as experiment_scoring
from app.services.experiments.scoring import Claimed, stored_scorer, wake_followers
from app.worker.context import WorkerContext
from app.worker.judge import judge

log = logging.getLogger(__name__)
RETRIED_ERRORS = (OSError, DockerError, SandboxError)
"""The worker's infrastructure failing, not the scorer (Docker unreachable, a `python`
scorer's sandbox that could not be made or run): the item is claimed again, at once."""
RETRIED_DB_ERRORS = (OperationalError, InterfaceError, PoolTimeout)
"""Postgres unreachable while storing a score: the item is claimed again."""
RELEASE_WAIT_S = 5.0


async def score_waiting(ctx: WorkerContext) -> int:
    """Claim, score and store one batch of waiting answers; how many were claimed."""
    s = ctx.settings
    claimed = await experiment_scoring.claim(
        ctx.sessions,
        limit=s.experiment_scoring_concurrency,
        lease_s=s.experiment_scoring_timeout_s + s.experiment_scoring_lease_margin_s,
    )
    done = await asyncio.gather(*(_score_one(ctx, c) for c in claimed), return_exceptions=True)
    for one, failure in zip(claimed, done, strict=True):
        if isinstance(failure, Exception):  # its lease expires and someone tries again
            log.error(
                "scoring %s/%s/%s/%d failed: %r",
                one.experiment_id,
                one.row_id,
                one.arm,
                one.attempt,
                failure,
                exc_info=failure,
            )
    return len(claimed)


async def _score_one(ctx: WorkerContext, claimed: Claimed) -> None:
    try:
        found = await score(ctx, claimed)
    except asyncio.CancelledError:  # the worker stops: the next one need not wait the lease
        await _release(ctx, claimed)
        raise
    except RETRIED_ERRORS:  # tried again after a backoff, not after the whole lease
        await _release(ctx, claimed, retry_in_s=_backoff_s(ctx, claimed))
        raise
    if isinstance(found, JudgeUnavailable) and claimed.claims <= claimed.retries:
        delay = _backoff_s(ctx, claimed)
        log.info(
            "the judge of %s is out of reach; scoring again in %g s: %s",
            claimed.experiment_id,
            delay,
            found.message,
        )
        await _release(ctx, claimed, retry_in_s=delay)
        return
    try:
        events = await experiment_scoring.write_score(ctx.sessions, claimed, found)
    except RETRIED_DB_ERRORS:
        raise
    except (SQLAlchemyError, ValueError) as exc:  # Postgres refused what the scorer gave
        log.warning(
            "the score of an item of %s could not be stored: %r", claimed.experiment_id, exc
        )
        refused = ScorerError(f"the scorer's result could not be stored: {type(exc).__name__}")
        events = await experiment_scoring.write_score(ctx.sessions, claimed, refused)
    if not events:
        log.info("lost the scoring lease of an item of %s; not written", claimed.experiment_id)
    await wake_followers(ctx.redis, claimed.experiment_id, events)


def _backoff_s(ctx: WorkerContext, claimed: Claimed) -> float:
    """`SANDHIVE_EXPERIMENT_SCORING_RETRY_S`, doubled at each further try."""
    doubling: int = 2 ** max(claimed.claims - 1, 0)
    return ctx.settings.experiment_scoring_retry_s * doubling


async def _release(
    ctx: WorkerContext, claimed: Claimed, *, retry_in_s: float | None = None
) -> None:
    """Give the lease back, shielded from the cancellation under way (best effort: a lease
    not given back only expires)."""
    releasing = asyncio.ensure_future(
        experiment_scoring.release(ctx.sessions, claimed, retry_in_s=retry_in_s)
    )
    try:
        await asyncio.shield(releasing)
    except asyncio.CancelledError:
        with suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(releasing), RELEASE_WAIT_S)
    except (SQLAlchemyError, OSError) as exc:
        log.warning("could not give back a scoring lease of %s: %r", claimed.experiment_id, exc)


async def score(ctx: WorkerContext, claimed: Claimed) -> Score | ScorerError:
    """The claimed answer's score, or why the scorer could not give one (`score_with`),
    after at most `experiment_scoring_max_claims` claims of the item in all."""
    # A judge out of reach gets the experiment's own retries even past the server's cap.
    limit = max(ctx.settings.experiment_scoring_max_claims, claimed.retries + 1)
    if claimed.claims > limit:
        return ScoringFailed(
            f"scoring failed {limit} times (SANDHIVE_EXPERIMENT_SCORING_MAX_CLAIMS): "
            "each try ended without a result (its worker lost, Docker unreachable); see the "
            "workers' logs",
            {"claims": limit, "stage": "scoring"},  # a regrade scores it again
        )
    try:
        scorer = stored_scorer(claimed.scorer, ctx.settings)
    except ValueError as exc:  # a stored spec this version cannot build
        return ScorerError(f"the experiment's scorer cannot be built any more: {exc}")
    return await score_with(ctx, scorer, claimed.answer, claimed.row)


async def score_with(
    ctx: WorkerContext, scorer: Scorer, answer: str | None, row: Mapping[str, Any]
) -> Score | ScorerError:
    """`scorer`'s score of `answer` for `row`, or why it could not give one, within
    `experiment_scoring_timeout_s`: the entry point of every deferred scoring (an
    experiment's item, an episode's reward, `app.worker.episodes.reward`).

    Whatever the scorer raises is the answer's scorer error (with the exception's type),
    except a failure of this worker's infrastructure (Docker or the network unreachable:
    OSError, aiodocker's DockerError, `RETRIED_ERRORS`), which propagates: the caller
    decides (an experiment's item is claimed again, by this worker or another).
    """
    timeout_s = ctx.settings.experiment_scoring_timeout_s
    try:
        with metrics.scoring(scorer.kind):
            async with asyncio.timeout(timeout_s):
                return await _dispatch(ctx, scorer, answer, row)
    except ScorerError as exc:
        return exc
    except TimeoutError:
        return ScorerError(
            f"scorer {scorer.kind!r} took longer than {timeout_s:g} s "
            "(SANDHIVE_EXPERIMENT_SCORING_TIMEOUT_S)",
            {"timeout_s": timeout_s},
        )
    except RETRIED_ERRORS:
        raise
    except Exception as exc:  # the scorer's own failure (a hostile or broken one): its error
        log.warning("scorer %r failed unexpectedly", scorer.kind, exc_info=True)
        return ScorerError(f"scorer {scorer.kind!r} failed: {type(exc).__name__}: {exc}"[:1000])


async def _dispatch(
    ctx: WorkerContext, scorer: Scorer, answer: str | None, row: Mapping[str, Any]
) -> Score:
    if isinstance(scorer, LlmJudgeScorer):
        return await judge(ctx.runner, scorer, answer, row)
    if isinstance(scorer, PythonScorer):
        image = ctx.settings.sandbox_image
        # The worker's labels: if this process dies before the container's deadline runs
        # (between its create and start), the reaper removes it once the worker is gone.
        labels = {INSTANCE_LABEL: ctx.instance, WORKER_LABEL: ctx.name}
        return await score_in_sandbox(ctx.docker, image, scorer, answer, row, labels=labels)
    return await score_off_loop(scorer, answer, row, ctx.settings)  # a built-in (regrade)
