"""Advancing experiments: score the items whose task ended, start pending ones, finish.

Run by every worker as a chore (`advance_all`, every `experiment_tick_s`) and by the API
right after an experiment is created (`advance`), the same code either way. Each
experiment is advanced in one transaction holding its row (FOR UPDATE SKIP LOCKED), so two
workers never advance the same experiment at once: an item's task is created in the same
transaction that marks it running (never two tasks for one item), and an item is scored
only while `running`, so a re-run scores nothing twice. Tasks are enqueued after the
commit; if that fails, reconciliation enqueues the committed rows (invariant 1).

A slow (deferred) scorer is not run here: its items move to `scoring`, and a worker's
scoring loop scores them outside this transaction (`experiment_scoring`). Every change is
reported by an experiment event recorded in the same transaction (item.started, item.ended,
item.retried, experiment.finished); followers are woken after the commit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import exists, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app import metrics
from app.bus import keys, queue
from app.config import Settings
from app.db import models
from app.db.engine import Sessions, db_now
from app.domain.resolve import check_inputs, resolve_spec
from app.domain.scored_answer import AGENT_REASONS, scored_answer
from app.errors import InvalidInput, TooLarge, TooManyRequests
from app.ids import utc_now
from app.scoring.offload import score_off_loop
from app.scoring.types import Score, Scorer, ScorerError, from_task, is_deferred
from app.scoring.verifier import verdict
from app.services.experiments.events import record_experiment_events
from app.services.experiments.input import arm_submission, item_prompt
from app.services.experiments.notify import experiment_finished
from app.services.experiments.rows import ROW, with_rows
from app.services.experiments.scoring import item_key, json_safe, stored_scorer, wake_followers
from app.services.images import task_images
from app.services.images.own import own_images
from app.services.tasks import backpressure
from app.services.tasks.service import new_task, store_task
from app.states import TERMINAL, FinishReason, TaskStatus

log = logging.getLogger(__name__)
Item = models.ExperimentItem
Event = tuple[str, dict[str, Any]]
WORK_LEFT = ("pending", "running", "scoring")
SCORE_BATCH = 200
"""Items recorded per experiment and transaction; the rest wait for the next tick."""
PRESCORE_ROUNDS = 8
"""Answers a step scores with a built-in scorer: this many per pool process, so a step's
scoring is bounded (8 x `SANDHIVE_SCORING_TIMEOUT_S` at worst); the rest wait a tick."""


ScoredText = Callable[[str, str, str | None, str | None], str | None]
"""(arm, task status, finish reason, answer) -> the text the experiment's rules score."""


def scored_text(spec: Mapping[str, Any]) -> ScoredText:
    """`scored_answer` under an experiment's stored rules and its arms' modes."""
    package = spec.get("rules") == "package"
    sandbox = {arm["name"] for arm in spec["arms"] if arm["mode"] == "sandbox"}

    def text(arm: str, status: str, reason: str | None, answer: str | None) -> str | None:
        return scored_answer(status, reason, answer, package=package, sandbox=arm in sandbox)

    return text


async def advance_all(sessions: Sessions, redis: Redis, settings: Settings) -> int:
    """Advance every experiment with work left; the number of tasks started."""
    exp = models.Experiment
    busy = exists().where(Item.experiment_id == exp.id, Item.status.in_(("running", "scoring")))
    async with sessions() as session:
        ids = list(
            await session.scalars(
                select(exp.id).where(or_(exp.status == "running", busy)).order_by(exp.created_at)
            )
        )
    started = 0
    for experiment_id in ids:
        try:
            started += len(await advance(sessions, redis, settings, experiment_id))
        except Exception:  # one broken experiment must not stop every other one advancing
            log.error("could not advance experiment %s", experiment_id, exc_info=True)
    return started


async def advance(
    sessions: Sessions, redis: Redis, settings: Settings, experiment_id: str
) -> list[str]:
    """One step of one experiment; the ids of the tasks it started (none if another holds it)."""
    async with _scoring_turn(redis, settings, experiment_id) as mine:
        prescored = await _prescore(sessions, settings, experiment_id) if mine else {}
        return await _advance(sessions, redis, settings, experiment_id, prescored)


@asynccontextmanager
async def _scoring_turn(
    redis: Redis, settings: Settings, experiment_id: str
) -> AsyncIterator[bool]:
    """Whether this process scores the experiment's answers this step: one worker at a time
    (every worker advances every experiment each tick; the others would score the same
    answers and throw the scores away). Redis unreachable: every one may, as before."""
    key = f"{keys.PREFIX}:experiments:{experiment_id}:scoring"
    # As long as a step's scoring can take (its answers on every pool process in turn), so
    # a worker that died holding it delays the others that long at most.
    ttl_ms = int((settings.scoring_timeout_s * PRESCORE_ROUNDS + 30) * 1000)
    try:
        mine = bool(await redis.set(key, "1", nx=True, px=ttl_ms))
    except (RedisError, OSError):
        mine = True
    try:
        yield mine
    finally:
        if mine:
            with suppress(RedisError, OSError):
                await redis.delete(key)


async def _advance(
    sessions: Sessions,
    redis: Redis,
    settings: Settings,
    experiment_id: str,
    prescored: Prescored,
) -> list[str]:
    async with sessions.begin() as session:
        exp = await session.scalar(
            select(models.Experiment)
            .where(models.Experiment.id == experiment_id)
            .with_for_update(skip_locked=True)
        )
        if exp is None:
            return []
        events = await _score_ended(session, settings, exp, prescored)
        started: list[str] = []
        if exp.status == "running":
            started = await _start_pending(session, settings, exp, events)
            await _finish_if_done(session, exp, events)
        recorded = await record_experiment_events(session, exp.id, events)
    await wake_followers(redis, experiment_id, recorded)
    images = await task_images.images_of(sessions, started)
    for task_id in started:
        try:
            await queue.enqueue(redis, task_id, images.get(task_id, "default"))
        except (RedisError, OSError) as exc:
            log.warning("could not enqueue %s (reconciliation will): %r", task_id, exc)
    return started


# Scoring the items whose task ended


Prescored = dict[str, tuple[str, Score | ScorerError]]
"""The item's task id -> (the answer scored, its score or why there is none)."""


async def _prescore(sessions: Sessions, settings: Settings, experiment_id: str) -> Prescored:
    """The built-in scorer's verdicts on the answers this step will record, computed before
    its transaction, with no row locked, in `app.scoring.offload`'s processes: a slow
    answer neither stalls this process's loop (its leases) nor holds the experiment's
    row. Nothing for a deferred scorer, whose items go to `scoring`."""
    task = models.Task
    async with sessions() as session:
        exp = await session.get(models.Experiment, experiment_id)
        if exp is None or exp.spec.get("scorer") is None:
            return {}
        try:
            scorer = stored_scorer(exp.spec["scorer"], settings)
        except ValueError:
            return {}  # recorded as each item's error in the transaction
        if is_deferred(scorer) or from_task(scorer):
            return {}
        package = exp.spec.get("rules") == "package"
        to_score = scored_text(exp.spec)
        ended = (
            await session.execute(
                with_rows(
                    select(task.id, ROW, task.status, task.finish_reason, task.answer, Item.arm)
                )
                .join(task, task.id == Item.task_id)
                .where(Item.experiment_id == experiment_id, Item.status == "running")
                .where(
                    task.status == TaskStatus.succeeded
                    if not package
                    else task.status.in_(TERMINAL)
                )
                .order_by(Item.seq)
                .limit(settings.scoring_processes * PRESCORE_ROUNDS)
            )
        ).all()
    answered = [
        (task_id, row, text)
        for task_id, row, status, reason, answer, arm in ended
        if (text := to_score(arm, status, reason, answer)) is not None
    ]

    async def one(answer: str, row: Mapping[str, Any]) -> Score | ScorerError:
        try:
            with metrics.scoring(scorer.kind):
                return await score_off_loop(scorer, answer, row, settings)
        except ScorerError as exc:
            return exc

    found = await asyncio.gather(*(one(answer, row) for _, row, answer in answered))
    return {
        task_id: (answer, result)
        for (task_id, _, answer), result in zip(answered, found, strict=True)
    }


async def _score_ended(
    session: AsyncSession, settings: Settings, exp: models.Experiment, prescored: Prescored
) -> list[Event]:
    """Record how each item whose task ended ends; its `item.ended` events. An answer for
    the built-in scorer that `_prescore` did not see (its task ended since) waits for the
    next step."""
    task = models.Task
    query = (
        select(Item, task)
        .outerjoin(task, task.id == Item.task_id)
        .where(Item.experiment_id == exp.id, Item.status == "running")
        .where(or_(task.id.is_(None), task.status.in_(TERMINAL)))
        .order_by(Item.seq)
        .limit(SCORE_BATCH)
        .with_for_update(of=Item)
    )
    rows = list(await session.execute(query))
    if not rows:
        return []
    try:
        scorer: Scorer | ScorerError = stored_scorer(exp.spec["scorer"], settings)
    except ValueError as exc:  # a stored spec this version cannot build: its items' error
        scorer = ScorerError(f"the experiment's scorer cannot be built any more: {exc}")
    # A cancelled experiment starts nothing more: its failed items end, none waits to rerun.
    retries = int(exp.spec.get("infrastructure_retries", 0)) if exp.status == "running" else 0
    to_score = scored_text(exp.spec)
    now = None  # Postgres's, read once if an item is retried
    events: list[Event] = []
    for item, ended in rows:
        text = None
        if ended is not None:
            text = to_score(item.arm, ended.status, ended.finish_reason, ended.answer)
        answer, score = prescored.get(item.task_id or "") or (None, None)
        score = score if text is not None and answer == text else None
        lost = None
        if ended is not None and not isinstance(scorer, ScorerError) and from_task(scorer):
            text, score, lost = verified(ended)
        failed_task = item.task_id
        if not record_end(item, ended, scorer, score, to_score=text, retries=retries, lost=lost):
            continue
        if item.status == "pending":  # the service failed its task: it runs again, later
            assert ended is not None  # only a task's failure is retried
            now = now or await db_now(session)
            item.updated_at = now  # the backoff's start, on one clock
            retried = {
                "task_id": failed_task,
                "reason": ended.finish_reason,
                "retries": item.retries,
                "usage": dict(ended.usage or {}),
            }
            events.append(("item.retried", {**item_key(item), **retried}))
        else:
            events.append(("item.ended", ended_data(item)))
    return events


def verified(task: models.Task) -> tuple[str | None, Score | ScorerError | None, str | None]:
    """(the answer kept, the score, why the service failed) of a task a `verifier` scores:
    its verification's reward, whatever the agent answered; nothing to score without one
    (the task ended for the service, or was cancelled); a verifier the service could not
    run is the task's infrastructure failure, retried as a failed task is."""
    found = task.verification
    if found is None or task.status == TaskStatus.cancelled:
        return None, None, None
    if found.get("infrastructure"):
        return None, None, str(found.get("error") or "the verifier could not run")
    try:
        return task.answer or "", verdict(found), None
    except ScorerError as exc:
        return task.answer or "", exc, None


def ended_data(item: models.ExperimentItem) -> dict[str, Any]:
    """The `item.ended` event of an item: its new status (`scoring` for a slow scorer)."""
    return {
        **item_key(item),
        "status": item.status,
        "score": item.score,
        "error_kind": item.error_kind,
        "task_id": item.task_id,
    }


def record_end(
    item: models.ExperimentItem,
    task: models.Task | None,
    scorer: Scorer | ScorerError,
    score: Score | ScorerError | None,
    *,
    to_score: str | None,
    retries: int = 0,
    lost: str | None = None,
) -> bool:
    """The item's end from its task's: scored, cancelled or an error of some kind; or, with
    a deferred scorer and an answer, `scoring` (free for any worker's scoring loop). A
    ScorerError for `scorer`: the scorer could not be built, so an answer is its error.
    `to_score`: the text the experiment's rules score for this end (`scored_answer`), kept
    as the item's answer. `score`: a built-in scorer's verdict on it, computed off the loop;
    an answer to be scored without one is left as it is (False: not ended yet). An item
    whose task the service failed goes back to `pending` without its task, while it has
    been retried fewer than `retries` times (the experiment's `infrastructure_retries`);
    `lost`: why the service failed a task that otherwise ended well (its verifier)."""
    if task is not None and to_score is not None and _awaits_its_score(scorer, score):
        return False
    item.updated_at = utc_now()
    if task is None:
        _error(item, "infrastructure", "the item's task no longer exists")
        return True
    reason = FinishReason(task.finish_reason) if task.finish_reason else None
    failed = (task.status == TaskStatus.failed and reason not in AGENT_REASONS) or lost is not None
    if failed and (item.retries or 0) < retries:  # as if it had not run: no usage, no answer
        item.status, item.task_id, item.retries = "pending", None, (item.retries or 0) + 1
        return True
    _copy_usage(item, task)
    item.answer = task.answer if to_score is None else to_score
    if task.status == TaskStatus.cancelled:
        item.status = "cancelled"
    elif to_score is not None:
        _judge(item, scorer, score)
    elif failed:
        message = lost or task.error or f"the task ended with {reason}"
        _error(item, "infrastructure", message, reason=reason, retries=item.retries or 0)
    elif task.status != TaskStatus.succeeded:
        _error(item, "agent", task.error or f"the task ended with {reason}", reason=reason)
    else:
        _error(item, "agent", "the agent gave no answer (no output/answer.txt)")
    return True


def _awaits_its_score(scorer: Scorer | ScorerError, score: Score | ScorerError | None) -> bool:
    """An answer for a built-in scorer that has not been scored yet."""
    built_in = not isinstance(scorer, ScorerError) and not is_deferred(scorer)
    return built_in and score is None


def _judge(
    item: models.ExperimentItem, scorer: Scorer | ScorerError, score: Score | ScorerError | None
) -> None:
    if isinstance(scorer, ScorerError):
        _error(item, "scorer", scorer.message, **scorer.detail)
    elif is_deferred(scorer):
        item.status = "scoring"
        item.scoring_until = None
        item.scoring_claims = 0
    elif isinstance(score, ScorerError):
        _error(item, score.kind, score.message, **score.detail)
    elif score is not None:
        item.status = "scored"
        item.score = score.value
        item.detail = json_safe(score.detail)


def _error(item: models.ExperimentItem, kind: str, message: str, **detail: Any) -> None:
    item.status = "error"
    item.error_kind = kind
    item.detail = json_safe({"message": message, **detail})


def _copy_usage(item: models.ExperimentItem, task: models.Task) -> None:
    usage: Mapping[str, Any] = task.usage or {}
    item.prompt_tokens = int(usage.get("prompt_tokens", 0))
    item.completion_tokens = int(usage.get("completion_tokens", 0))
    item.steps = int(usage.get("steps", 0))
    if task.started_at is not None and task.finished_at is not None:
        item.seconds = (task.finished_at - task.started_at).total_seconds()


# Starting pending items, at most `concurrency` running at once


async def _start_pending(
    session: AsyncSession, settings: Settings, exp: models.Experiment, events: list[Event]
) -> list[str]:
    running = await session.scalar(
        select(func.count())
        .select_from(Item)
        .where(Item.experiment_id == exp.id, Item.status == "running")
    )
    slots = int(exp.spec["concurrency"]) - int(running or 0)
    if slots <= 0:
        return []
    backoff = settings.experiment_retry_backoff_s * func.power(2, Item.retries - 1)
    pending = await session.execute(
        with_rows(select(Item, ROW))
        .where(Item.experiment_id == exp.id, Item.status == "pending")
        .where(  # a retried item waits out its backoff, on Postgres's clock
            or_(
                Item.retries == 0,
                Item.updated_at <= func.now() - func.make_interval(0, 0, 0, 0, 0, 0, backoff),
            )
        )
        .order_by(Item.seq)
        .limit(slots)
        .with_for_update(of=Item)
    )
    arms = {arm["name"]: arm for arm in exp.spec["arms"]}
    started = []
    for item, row in list(pending):
        try:
            async with session.begin_nested():  # a refused start leaves the scores above
                arm = arms[item.arm]
                started.append(await _start_item(session, settings, exp, arm, item, row))
        except TooManyRequests:
            break  # the queue or the tenant is full: the next tick tries again
        except (InvalidInput, TooLarge, ValidationError) as exc:  # the server changed since
            _error(item, "infrastructure", f"the task was refused: {exc}")
            item.updated_at = utc_now()
            events.append(("item.ended", ended_data(item)))
            continue
        events.append(("item.started", {**item_key(item), "task_id": item.task_id}))
    return started


async def _start_item(
    session: AsyncSession,
    settings: Settings,
    exp: models.Experiment,
    arm: Mapping[str, Any],
    item: models.ExperimentItem,
    row: Mapping[str, Any],
) -> str:
    """Create the item's task exactly as a submission does, and link it; its id."""
    metadata = {"experiment": exp.id, "row": item.row_id, "arm": item.arm, "attempt": item.attempt}
    body = arm_submission(arm, *item_prompt(arm, row), metadata, row)
    own = await own_images(session, settings, exp.tenant_id, body.sandbox.image)
    spec = resolve_spec(body, settings, tenant=exp.tenant_id, own=own)
    files = check_inputs(body, settings)
    await backpressure.admit(session, settings, exp.tenant_id)
    task = await store_task(session, new_task(exp.tenant_id, body, spec), files)
    item.task_id = task.id
    item.status = "running"
    item.updated_at = utc_now()
    return task.id


async def _finish_if_done(
    session: AsyncSession, exp: models.Experiment, events: list[Event]
) -> None:
    """Nothing pending, running or scoring: the experiment ends (`finished`, or after a
    regrade the status it had before, `regrade_ends`)."""
    left = await session.scalar(
        select(func.count())
        .select_from(Item)
        .where(Item.experiment_id == exp.id, Item.status.in_(WORK_LEFT))
    )
    if not left:
        spec = dict(exp.spec)
        exp.status = spec.pop("regrade_ends", "finished")
        exp.spec = spec
        exp.finished_at = utc_now()
        events.append(("experiment.finished", {"status": exp.status}))
        await experiment_finished(session, exp)
