"""Episode rows: create (resolved and admitted like a task), read, and the state changes.

The row is the truth about an episode; the worker holding its sandbox and the API both
end it through `end`, which changes only an episode still active, so whichever ends it
first (the loop's end, a close, the idle reaper, a lost worker) is the one recorded.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.domain.resolve import check_inputs, dotted, resolve_spec
from app.errors import InvalidInput, NotFound
from app.ids import new_task_id, utc_now
from app.schemas.episodes import EpisodeCreate, EpisodeOut
from app.scoring.judge import LlmJudgeScorer
from app.scoring.python_code import PythonScorer
from app.services.experiments.scoring import build_scorer, json_safe, scorer_problems
from app.services.tasks import backpressure
from app.services.webhooks import service as webhooks
from app.specs import TaskSpec, read_spec, stored

ACTIVE = ("opening", "open")
DEFERRED_KINDS = frozenset({LlmJudgeScorer.kind, PythonScorer.kind})
"""The deferred scorers' kinds (`app.scoring.types.is_deferred`): the worker runs them."""
INFRASTRUCTURE = "infrastructure"


@dataclass(frozen=True)
class Opening:
    """What the worker needs to start an episode."""

    id: str
    prompt: str
    spec: TaskSpec
    inputs: list[tuple[str, bytes]]
    scorer: dict[str, Any] | None = None
    """The reward's scorer spec: a deferred one is run by the worker once the loop ends."""
    ground_truth: Any = None
    unsubmitted: str = "zero"
    """`answer_file`: an ending without `submit` is scored on the answer file too."""

    def scores(self, finish_reason: str, error_kind: str | None) -> bool:
        """Whether this ending's answer file is scored (`scores_answer`); never one the
        infrastructure caused."""
        return error_kind != "infrastructure" and scores_answer(finish_reason, self.unsubmitted)


LOOP_ENDS = frozenset({"max_steps", "timeout", "context_limit"})
"""The loop's own ends without `submit`: the policy's doing, its answer file read then."""


def scores_answer(finish_reason: str | None, unsubmitted: object) -> bool:
    """Whether an episode that ended so has its answer file scored: after `submit`; or,
    opened with `unsubmitted: answer_file`, after one of the loop's own ends (`LOOP_ENDS`),
    as the paper's RL environment scores `answer.txt` whatever ended the loop. Closed or
    idle episodes stopped mid-loop, with nothing read: they score 0."""
    if finish_reason == "submitted":
        return True
    return unsubmitted == "answer_file" and finish_reason in LOOP_ENDS


def new_episode_id() -> str:
    return "epi_" + new_task_id().removeprefix("tsk_")


def out(row: models.EpisodeRow) -> EpisodeOut:
    return EpisodeOut(
        id=row.id,
        status=row.status,
        steps=row.steps,
        finish_reason=row.finish_reason,
        error=row.error,
        error_kind=row.error_kind,
        answer=row.answer,
        created_at=row.created_at,
        ended_at=row.ended_at,
        parent_id=row.parent_id,
        fork_step=row.fork_step,
    )


def new_row(settings: Settings, tenant: str, body: EpisodeCreate) -> models.EpisodeRow:
    """The `opening` episode a request makes, checked (422) but not stored yet."""
    task = body.as_task()
    spec = resolve_spec(task, settings, tenant=tenant)
    inputs = check_inputs(task, settings)
    if body.scorer is not None:
        _check_scorer(body.scorer, settings)
    row = models.EpisodeRow(
        id=new_episode_id(),
        tenant_id=tenant,
        status="opening",
        prompt=body.prompt,
        spec={
            "task": stored(spec),
            "inputs": [[path, base64.b64encode(data).decode()] for path, data in inputs],
            "unsubmitted": body.unsubmitted,
        },
        scorer=body.scorer,
        ground_truth=body.ground_truth,
    )
    return row


def _check_scorer(spec: dict[str, Any], settings: Settings) -> None:
    """As an experiment's scorer is checked: its options under this server's limits (a
    `python` one's code size, timeout, memory), an `llm_judge`'s profile and model."""
    try:
        scorer = build_scorer(spec, settings)
    except ValueError as exc:
        raise InvalidInput(f"scorer: {exc}") from exc
    problems = scorer_problems(scorer, settings)
    if problems:
        found = "; ".join(f"{dotted(p['loc'][1:])}: {p['msg']}" for p in problems)
        raise InvalidInput(found, details=problems)


def has_deferred_scorer(row: models.EpisodeRow) -> bool:
    """Whether a worker scores the episode's submitted answer (`llm_judge`, `python`)
    before it answers the final step."""
    return row.scorer is not None and row.scorer.get("kind") in DEFERRED_KINDS


async def store(sessions: Sessions, settings: Settings, *episodes: models.EpisodeRow) -> None:
    """Insert checked episodes of one tenant within its limits (429 with nothing written)."""
    async with sessions.begin() as session:
        await backpressure.admit(session, settings, episodes[0].tenant_id, len(episodes))
        session.add_all(episodes)


def children_of(parent: models.EpisodeRow, n: int) -> list[models.EpisodeRow]:
    """A fork's `n` children, `opening`: the parent's task, scorer and ground truth; the
    step they start from is written by the worker that takes them (`assign`)."""
    return [
        models.EpisodeRow(
            id=new_episode_id(),
            tenant_id=parent.tenant_id,
            status="opening",
            prompt=parent.prompt,
            spec=parent.spec,
            scorer=parent.scorer,
            ground_truth=parent.ground_truth,
            parent_id=parent.id,
        )
        for _ in range(n)
    ]


async def discard(sessions: Sessions, episode_ids: Sequence[str]) -> None:
    """Delete episodes no worker took (a refused fork's children): nothing of them stays."""
    async with sessions.begin() as session:
        await session.execute(
            delete(models.EpisodeRow).where(
                models.EpisodeRow.id.in_(episode_ids), models.EpisodeRow.status == "opening"
            )
        )


async def find_many(
    sessions: Sessions, episode_ids: Sequence[str], *, missing_ok: bool = False
) -> list[models.EpisodeRow]:
    """The rows of `episode_ids`, in that order (KeyError for a missing one, unless
    `missing_ok`: then it is left out)."""
    async with sessions() as session:
        found = await session.scalars(
            select(models.EpisodeRow).where(models.EpisodeRow.id.in_(episode_ids))
        )
        by_id = {row.id: row for row in found}
    return [by_id[i] for i in episode_ids if not missing_ok or i in by_id]


async def find(sessions: Sessions, tenant: str, episode_id: str) -> models.EpisodeRow:
    """The tenant's episode; another tenant's is as unknown as a missing one (404)."""
    async with sessions() as session:
        row = await session.get(models.EpisodeRow, episode_id)
    if row is None or row.tenant_id != tenant:
        raise NotFound(f"no episode {episode_id!r}")
    return row


async def assign(
    sessions: Sessions, episode_id: str, worker: str, fork_step: int | None = None
) -> Opening | None:
    """Take an `opening` episode for `worker` (None: gone, or another took it); a fork's
    child records the step it starts from (`fork_step`)."""
    values: dict[str, Any] = {"status": "open", "worker": worker, "updated_at": utc_now()}
    if fork_step is not None:
        values["fork_step"] = values["steps"] = fork_step
    async with sessions.begin() as session:
        row = await session.scalar(
            update(models.EpisodeRow)
            .where(models.EpisodeRow.id == episode_id, models.EpisodeRow.status == "opening")
            .values(**values)
            .returning(models.EpisodeRow)
        )
        if row is None:
            return None
        data: dict[str, Any] = row.spec
        inputs = [(str(path), base64.b64decode(blob)) for path, blob in data["inputs"]]
        spec = read_spec(data["task"])
        unsubmitted = str(row.spec.get("unsubmitted", "zero"))
        return Opening(row.id, row.prompt, spec, inputs, row.scorer, row.ground_truth, unsubmitted)


async def end(
    sessions: Sessions,
    episode_id: str,
    *,
    status: str,
    finish_reason: str,
    error: str | None = None,
    error_kind: str | None = None,
    answer: str | None = None,
    steps: int | None = None,
    trajectory: list[dict[str, Any]] | None = None,
) -> bool:
    """End an active episode; False when it had already ended (the first end stands).
    `trajectory`: its steps as the worker holds them (`EpisodeRow.trajectory`)."""
    values: dict[str, Any] = {
        "status": status,
        "finish_reason": finish_reason,
        "error": error,
        "error_kind": error_kind,
        "answer": answer,
        "updated_at": utc_now(),
        "ended_at": utc_now(),
    }
    if steps is not None:
        values["steps"] = steps
    if trajectory is not None:
        values["trajectory"] = json_safe(trajectory)
    async with sessions.begin() as session:
        ended = await session.scalar(
            update(models.EpisodeRow)
            .where(models.EpisodeRow.id == episode_id, models.EpisodeRow.status.in_(ACTIVE))
            .values(**values)
            .returning(models.EpisodeRow)
        )
        if ended is not None and status == "closed":
            await _closed(session, ended)
    return ended is not None


async def record_reward(sessions: Sessions, episode_id: str, reward: dict[str, Any]) -> bool:
    """Store a deferred scorer's result once; False when one was already stored."""
    async with sessions.begin() as session:
        written = await session.scalar(
            update(models.EpisodeRow)
            .where(models.EpisodeRow.id == episode_id, models.EpisodeRow.reward.is_(None))
            .values(reward=json_safe(reward), updated_at=utc_now())
            .returning(models.EpisodeRow.id)
        )
    return written is not None


async def close_done(sessions: Sessions, episode_id: str) -> None:
    """A `done` episode the trainer deleted: `closed`, its result kept for the reward."""
    async with sessions.begin() as session:
        closed = await session.scalar(
            update(models.EpisodeRow)
            .where(models.EpisodeRow.id == episode_id, models.EpisodeRow.status == "done")
            .values(status="closed", updated_at=utc_now())
            .returning(models.EpisodeRow)
        )
        if closed is not None:
            await _closed(session, closed)


async def _closed(session: AsyncSession, row: models.EpisodeRow) -> None:
    """`episode.closed` in the transaction that closed it: the episode as GET returns it."""
    await webhooks.enqueue(
        session, row.tenant_id, "episode.closed", lambda: out(row).model_dump(mode="json")
    )


async def open_on(sessions: Sessions, worker: str) -> list[str]:
    """Ids of the episodes the row says `worker` holds."""
    async with sessions() as session:
        rows = await session.scalars(
            select(models.EpisodeRow.id).where(
                models.EpisodeRow.worker == worker, models.EpisodeRow.status == "open"
            )
        )
        return list(rows)
