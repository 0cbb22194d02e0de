"""Items waiting for a slow scorer: claimed under a lease, scored outside any transaction,
their score written once; plus the checks and helpers every experiment writer shares.

A deferred scorer (`llm_judge`, `python`; `app.scoring.types.is_deferred`) is too slow for
the advancing transaction, which holds the experiment's row, so an item with an answer
waits in `scoring`. A worker's scoring loop (`app.worker.scoring`) `claim`s some: in one
short transaction, `FOR UPDATE SKIP LOCKED`, it sets each one's `scoring_until` (its
lease) and commits; it scores them with no transaction open; then `write_score` stores a
score only if the item is still `scoring` under that very lease. A worker that died
mid-scoring leaves leases that expire, and another worker takes those items again; if the
first one comes back late, its write matches no row. So an answer is scored at least once
and its score stored exactly once. Imported by the worker and the other services; no
sandbox or model here.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import func, or_, select, update

from app.bus.experiment_live import notify
from app.config import Settings
from app.db import models
from app.db.engine import Sessions, db_now
from app.domain.resolve import Problem, problem
from app.ids import utc_now
from app.scoring.judge import LlmJudgeScorer
from app.scoring.python_code import PythonLimits
from app.scoring.registry import scorer_for
from app.scoring.types import Score, Scorer, ScorerError
from app.services.experiments.events import record_experiment_events
from app.services.experiments.rows import ROW, with_rows

log = logging.getLogger(__name__)
Item = models.ExperimentItem
Exp = models.Experiment
Events = Sequence[models.ExperimentEvent]


@dataclass(frozen=True)
class Claimed:
    """One item this worker holds the scoring lease of, with what scoring it needs."""

    experiment_id: str
    row_id: str
    arm: str
    attempt: int
    scorer: dict[str, Any]
    """The experiment's current scorer spec (a regrade's, if one is under way)."""
    answer: str | None
    row: dict[str, Any]
    lease: datetime
    """`scoring_until` as this claim set it: the write must find it unchanged."""
    claims: int = 1
    """How many times the item's current scoring has been claimed, this claim included."""
    retries: int = 0
    """The experiment's `infrastructure_retries` (0 once it is cancelled): how many more
    tries a judge out of reach gets."""


async def claim(sessions: Sessions, *, limit: int, lease_s: float) -> list[Claimed]:
    """Take up to `limit` items that wait for scoring (or whose lease expired), leased."""
    if limit <= 0:
        return []
    async with sessions.begin() as session:
        now = await db_now(session)  # every worker's claims and expiries on one clock
        lease = now + timedelta(seconds=lease_s)
        rows = list(
            await session.execute(
                with_rows(select(Item, Exp.spec, Exp.status, ROW))
                .join(Exp, Exp.id == Item.experiment_id)
                .where(Exp.status.in_(("running", "cancelled")))  # finished: none left
                .where(Item.status == "scoring")
                .where(or_(Item.scoring_until.is_(None), Item.scoring_until < now))
                .order_by(Item.updated_at, Item.seq)
                .limit(limit)
                .with_for_update(of=Item, skip_locked=True)
            )
        )
        for item, *_ in rows:
            item.scoring_until = lease
            item.scoring_claims += 1
    return [
        Claimed(
            item.experiment_id,
            item.row_id,
            item.arm,
            item.attempt,
            dict(spec["scorer"]),
            item.answer,
            dict(row),
            lease,
            item.scoring_claims,
            int(spec.get("infrastructure_retries", 0)) if status == "running" else 0,
        )
        for item, spec, status, row in rows
    ]


async def release(sessions: Sessions, claimed: Claimed, *, retry_in_s: float | None = None) -> bool:
    """Give the lease back unscored: a worker stopping mid-scoring (another worker takes
    the item at once, and the claim is not counted against the item's limit), or one whose
    infrastructure failed the try (`retry_in_s`: the item is tried again that long from
    now on Postgres's clock, the claim counted, so a Docker that stays unreachable ends it
    after `experiment_scoring_max_claims` tries spread over minutes, not seconds). False
    if the lease was not this claim's any more."""
    async with sessions.begin() as session:
        claims: Any = Item.scoring_claims  # counted
        until: datetime | None = None
        if retry_in_s is None:
            claims = func.greatest(Item.scoring_claims - 1, 0)
        else:
            until = await db_now(session) + timedelta(seconds=retry_in_s)
        released = await session.scalar(
            update(Item)
            .where(*_leased(claimed))
            .values(scoring_until=until, scoring_claims=claims)
            .returning(Item.row_id)
            .execution_options(synchronize_session=False)
        )
    return released is not None


def _leased(claimed: Claimed) -> tuple[Any, ...]:
    """The claimed item, only while it is still `scoring` under this very lease."""
    return (
        Item.experiment_id == claimed.experiment_id,
        Item.row_id == claimed.row_id,
        Item.arm == claimed.arm,
        Item.attempt == claimed.attempt,
        Item.status == "scoring",
        Item.scoring_until == claimed.lease,
    )


async def write_score(
    sessions: Sessions, claimed: Claimed, found: Score | ScorerError
) -> list[models.ExperimentEvent]:
    """Store the item's score (or its scorer error) if it is still under this claim's lease;
    the `item.scored` event recorded with it, or none when the lease was lost."""
    if isinstance(found, Score):
        values: dict[str, Any] = {"status": "scored", "score": found.value, "error_kind": None}
        detail = found.detail
    else:
        values = {"status": "error", "score": None, "error_kind": found.kind}
        detail = {"message": found.message, **found.detail}
    async with sessions.begin() as session:
        # The experiment's row first, as every writer takes it: no lock-order deadlock.
        await session.execute(
            select(Exp.id).where(Exp.id == claimed.experiment_id).with_for_update()
        )
        written = await session.scalar(
            update(Item)
            .where(*_leased(claimed))
            .values(**values, detail=json_safe(detail), scoring_until=None, updated_at=utc_now())
            .returning(Item.row_id)
            .execution_options(synchronize_session=False)
        )
        if written is None:
            return []
        key = {"row_id": claimed.row_id, "arm": claimed.arm, "attempt": claimed.attempt}
        return await record_experiment_events(
            session, claimed.experiment_id, [("item.scored", {**key, **values})]
        )


# Shared by every writer of an experiment: scorers built and checked, followers woken


def build_scorer(spec: Mapping[str, Any], settings: Settings) -> Scorer:
    """The scorer of a new spec under this server's limits; ValueError says what is wrong.
    For accepting one (creation, regrade); a stored one is `stored_scorer`."""
    return _built(_spec_key(spec), PythonLimits.from_settings(settings))


def stored_scorer(spec: Mapping[str, Any], settings: Settings) -> Scorer:
    """The scorer of an experiment's stored spec, which passed `build_scorer` when it was
    accepted. The operator's maxima (code size, timeout, memory, output) are not checked
    again: lowering one must not break the experiments already accepted under it (a lower
    `SANDHIVE_EXPERIMENT_SCORING_TIMEOUT_S` still bounds every scoring). Server-set values
    (pids, scratch) and the defaults of options left out are today's. ValueError if the
    spec no longer builds at all (a kind or option this version lacks)."""
    current = PythonLimits.from_settings(settings)
    unbounded = replace(
        current,
        code_max_bytes=UNBOUNDED,
        max_timeout_s=UNBOUNDED,
        max_memory_mb=UNBOUNDED,
        max_output_bytes=UNBOUNDED,
    )
    return _built(_spec_key(spec), unbounded)


UNBOUNDED = 2**62
SCORER_CACHE = 64
"""Built scorers kept (by spec and limits): the runner and the scoring loop need one on
every tick and claim, and a `python` one parses up to the code limit each build."""


def _spec_key(spec: Mapping[str, Any]) -> str:
    if not isinstance(spec, Mapping):
        raise ValueError(f"a scorer spec must be an object with a 'kind', got {spec!r:.80}")
    try:
        return json.dumps(spec, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"a scorer spec must be JSON: {exc}") from exc


@lru_cache(maxsize=SCORER_CACHE)
def _built(spec_json: str, limits: PythonLimits) -> Scorer:
    """Scorers are immutable, so one built object serves every caller (ValueErrors are
    not cached: a bad spec is rebuilt, and refused, each time)."""
    return scorer_for(json.loads(spec_json), python_limits=limits)


def scorer_problems(scorer: Scorer, settings: Settings) -> list[Problem]:
    """What the scorer needs from this server and does not find (an `llm_judge`'s profile
    and model), located under `scorer` as a task's `llm` problems are under `llm`."""
    if not isinstance(scorer, LlmJudgeScorer):
        return []
    profiles = settings.llm_profiles()
    profile = profiles.get(scorer.profile)
    if profile is None:
        available = sorted(profiles)
        there = f"available: {', '.join(available)}" if available else "none is configured"
        msg = f"unknown llm profile {scorer.profile!r}; {there}"
        return [problem(("scorer", "profile"), msg, "unknown_profile", available=available)]
    model = scorer.model or profile.model
    if not model:
        return [problem(("scorer", "model"), "no model given and the profile has none")]
    if not profile.allows(model):
        allowed = sorted({*profile.models, profile.model} - {""})
        msg = f"model {model!r} is not allowed by llm profile {scorer.profile!r}"
        return [problem(("scorer", "model"), msg, "not_allowed", allowed=allowed)]
    return []


def grading_of(spec: Mapping[str, Any]) -> int:
    """The experiment's current grading: 1, plus one per regrade."""
    return len(spec.get("earlier_scorers", ())) + 1


def item_key(item: models.ExperimentItem) -> dict[str, Any]:
    """What every item event names the item by."""
    return {"row_id": item.row_id, "arm": item.arm, "attempt": item.attempt}


async def wake_followers(redis: Redis, experiment_id: str, events: Events) -> None:
    """After the commit: tell followers the newest seq. Best effort, as a lost wake-up costs
    them a poll interval and never an event (they replay Postgres)."""
    if not events:
        return
    try:
        await notify(redis, experiment_id, events[-1].seq)
    except (RedisError, OSError) as exc:
        log.warning("could not wake the followers of %s: %r", experiment_id, exc)


def json_safe(value: Any) -> Any:
    """What JSONB stores, from anything a scorer, a judge or user code produced: strings
    without NUL (jsonb refuses \\u0000) and without lone surrogates (not UTF-8, so not
    sendable: each becomes "?"), finite numbers, and anything else as its string. Every
    writer of scorer text into an item goes through this, else Postgres refuses the write."""
    if isinstance(value, str):
        return _clean(value)
    if isinstance(value, dict):
        return {_clean(str(k)): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    return _clean(str(value))


def _clean(text: str) -> str:
    text = text.replace("\x00", "\ufffd")
    if text.isascii():
        return text
    return text.encode("utf-8", "replace").decode()
