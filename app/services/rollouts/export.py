"""`GET .../export?format=jsonl`: one JSON line per rollout, ready for a trainer's loader.

Imported by the API. The tenant check (404) happens before the first byte, when the
export is opened; the lines are then built a page of items at a time (`EXPORT_PAGE`, the
tasks and steps of `LINES_BATCH` of them per query), so an experiment of any size streams
in bounded memory (bench/results_memory.py). Every field is
documented in docs/rl.md ("Use Sandhive for RL"). A captured rollout's conversation
is rebuilt exactly from its steps' stored deltas (`app.domain.rollout_capture`); one that
was not captured still has its turns (text, tool call, observation), no token ids.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, cast, func, select, tuple_, type_coerce
from sqlalchemy.orm import load_only

from app.db import models
from app.db.engine import Sessions
from app.domain.rollout_capture import flattened, rebuild
from app.domain.rollout_groups import Member, groups_of, rollouts_by_task
from app.errors import NotFound
from app.schemas.lines import one_line
from app.schemas.rollouts import GroupOut, RolloutOut
from app.services.experiments.service import find_experiment
from app.services.visibility import find_task
from app.states import FinishReason, TaskStatus

Item = models.ExperimentItem
Step = models.Step
NOT_INFRASTRUCTURE = frozenset(
    {
        FinishReason.submitted,
        FinishReason.max_steps,
        FinishReason.context_limit,
        FinishReason.timeout,
        FinishReason.cancelled,
    }
)
"""A task's endings that are the agent's doing or the caller's (the experiments' rule)."""
Placed = tuple[Item, GroupOut, RolloutOut]
COMPACT = load_only(
    Item.experiment_id,
    Item.row_id,
    Item.arm,
    Item.attempt,
    Item.seq,
    Item.status,
    Item.score,
    Item.error_kind,
    Item.task_id,
    raiseload=True,
)
"""What placing a rollout in its group reads of an item: never its row (documents and all),
answer, detail or gradings, so an item costs a few KiB however large its row."""
EXPORT_PAGE = 100
"""Items placed per query of the experiment's export."""
LINES_BATCH = 10
"""Tasks whose steps one query of the export reads (a captured rollout's steps are large)."""
TASK_COLUMNS = (
    models.Task.id,
    models.Task.spec,
    models.Task.attempt,
    models.Task.status,
    models.Task.finish_reason,
    models.Task.error,
    models.Task.answer,
)
TASK_FIELDS = load_only(*TASK_COLUMNS, raiseload=True)
"""What a line reads of its task: never its prompt (a long-context row's documents)."""
WITH_PROMPT = load_only(*TASK_COLUMNS, models.Task.prompt, raiseload=True)
"""What a record for ATIF or Inspect reads: those, and the prompt (their first message)."""
CAPTURE = type_coerce(func.coalesce(Step.capture_json, cast(Step.capture, JSON)), JSON).label(
    "capture"
)
"""A step's capture: as sent (`capture_json`), or as an earlier release stored it."""
STEP_FIELDS = (
    Step.index,
    Step.thought,
    Step.reasoning,
    Step.action,
    Step.observation,
    Step.interrupted,
    CAPTURE,
    Step.started_at,
    Step.llm_ms,
    Step.prompt_tokens,
    Step.completion_tokens,
)
"""A step's columns a record reads (the JSONL line uses the first seven; ATIF all)."""


@dataclass(frozen=True)
class Record:
    """One rollout as stored, before any format: its task (`TASK_FIELDS`, and its prompt
    when asked), its steps (`STEP_FIELDS` by name), and its item and group when it is an
    experiment's."""

    task: models.Task
    steps: list[dict[str, Any]]
    placed: Placed | None


async def open_task_export(sessions: Sessions, tenant: str, task_id: str) -> AsyncIterator[str]:
    """The one line of the tenant's task (NotFound before any byte for another's)."""
    return _each([jsonl_line(rollout_line(await task_record(sessions, tenant, task_id)))])


async def task_record(
    sessions: Sessions,
    tenant: str,
    task_id: str,
    *,
    attempt: int | None = None,
    with_prompt: bool = False,
) -> Record:
    """The tenant's task as a record (NotFound for another's), of its latest worker
    attempt or of `attempt`."""
    async with sessions() as session:
        task = await find_task(session, tenant, task_id)
        item = await session.scalar(select(Item).options(COMPACT).where(Item.task_id == task.id))
        placed = None
        if item is not None:
            siblings = await session.scalars(
                select(Item)
                .options(COMPACT)
                .where(
                    Item.experiment_id == item.experiment_id,
                    Item.row_id == item.row_id,
                    Item.arm == item.arm,
                )
            )
            placed = _placed(list(siblings)).get(task.id)
    found = await _records(sessions, [(task.id, placed)], with_prompt=with_prompt, attempt=attempt)
    if not found:  # deleted between the two reads
        raise NotFound(f"no task {task_id}")
    return found[0]


async def open_experiment_export(
    sessions: Sessions,
    tenant: str,
    experiment_id: str,
    *,
    arm: str | None = None,
    page: int = EXPORT_PAGE,
) -> AsyncIterator[str]:
    """A line per started item of the tenant's experiment (of one arm, if given), in start
    order, read `page` items at a time."""
    records = await open_experiment_records(sessions, tenant, experiment_id, arm=arm, page=page)
    return (jsonl_line(rollout_line(record)) async for record in records)


async def open_experiment_records(
    sessions: Sessions,
    tenant: str,
    experiment_id: str,
    *,
    arm: str | None = None,
    page: int = EXPORT_PAGE,
    with_prompt: bool = False,
) -> AsyncIterator[Record]:
    """A record per started item of the tenant's experiment (of one arm, if given), in
    start order, read `page` items at a time (NotFound before the first for another's, or
    for an arm it does not have)."""
    async with sessions() as session:
        exp = await find_experiment(session, tenant, experiment_id)
    arms_of(exp, arm)
    return _experiment_records(sessions, exp.id, page, arm, with_prompt)


def arms_of(exp: models.Experiment, arm: str | None) -> list[str]:
    """The experiment's arm names, or `[arm]`; NotFound for an arm it does not have."""
    names = [a["name"] for a in exp.spec["arms"]]
    if arm is None:
        return names
    if arm not in names:
        raise NotFound(f"experiment {exp.id} has no arm {arm!r} (its arms: {', '.join(names)})")
    return [arm]


async def _experiment_records(
    sessions: Sessions, experiment_id: str, size: int, arm: str | None, with_prompt: bool
) -> AsyncIterator[Record]:
    """`size` started items at a time, by `seq`, each page placed in its groups from those
    groups' members alone (a group's attempts lie pages apart): memory holds a page, not
    the experiment."""
    after = -1
    while True:
        query = select(Item).options(COMPACT).where(Item.experiment_id == experiment_id)
        if arm is not None:
            query = query.where(Item.arm == arm)
        async with sessions() as session:
            page = list(
                await session.scalars(
                    query.where(Item.seq > after, Item.task_id.is_not(None))
                    .order_by(Item.seq)
                    .limit(size)
                )
            )
            if not page:
                return
            after = page[-1].seq
            groups = {(item.arm, item.row_id) for item in page}
            members = await session.scalars(  # by the key's prefix (experiment, row)
                select(Item)
                .options(COMPACT)
                .where(Item.experiment_id == experiment_id)
                .where(Item.row_id.in_({row_id for _, row_id in groups}))
                .where(Item.arm.in_({arm for arm, _ in groups}))
            )
            placed = _placed([m for m in members if (m.arm, m.row_id) in groups])
        for start in range(0, len(page), LINES_BATCH):
            batch = [
                (i.task_id, placed.get(i.task_id))
                for i in page[start : start + LINES_BATCH]
                if i.task_id is not None  # all of them: the page's query
            ]
            for record in await _records(sessions, batch, with_prompt=with_prompt):
                yield record


async def _each(lines: Sequence[str]) -> AsyncIterator[str]:
    for line in lines:
        yield line


def _placed(items: Sequence[Item]) -> dict[str, Placed]:
    """Each started item with its GRPO group and its rollout in it, by task id."""
    members = [Member(i.row_id, i.arm, i.attempt, i) for i in items]
    by_task = rollouts_by_task(groups_of(members))
    return {
        i.task_id: (i, *by_task[i.task_id])
        for i in items
        if i.task_id is not None and i.task_id in by_task
    }


async def _records(
    sessions: Sessions,
    tasks: Sequence[tuple[str, Placed | None]],
    *,
    with_prompt: bool,
    attempt: int | None = None,
) -> list[Record]:
    """A few tasks' records, from one query for the tasks and one for their steps (of each
    task's latest worker attempt, or of `attempt`); a task pruned since has none (an
    experiment item outlives its task)."""
    ids = [task_id for task_id, _ in tasks]
    fields = WITH_PROMPT if with_prompt else TASK_FIELDS
    async with sessions() as session:
        found = {
            t.id: t
            for t in await session.scalars(
                select(models.Task).options(fields).where(models.Task.id.in_(ids))
            )
        }
        keys = [(t.id, t.attempt if attempt is None else attempt) for t in found.values()]
        steps = (
            await session.execute(
                select(Step.task_id, *STEP_FIELDS)
                .where(tuple_(Step.task_id, Step.attempt).in_(keys))
                .order_by(Step.task_id, Step.index)
            )
        ).all()
    by_task: dict[str, list[dict[str, Any]]] = {}
    for step in steps:
        columns = dict(step._mapping)
        by_task.setdefault(columns.pop("task_id"), []).append(columns)
    return [
        Record(found[task_id], by_task.get(task_id, []), placed)
        for task_id, placed in tasks
        if task_id in found
    ]


def jsonl_line(value: Mapping[str, Any]) -> str:
    """One JSONL line, UTF-8 text kept readable, nothing in it that a reader splits at."""
    return one_line(json.dumps(value, ensure_ascii=False, separators=(",", ":"))) + "\n"


def rollout_line(record: Record) -> dict[str, Any]:
    """One rollout: where it sits, how it ended, its reward, and its conversation."""
    task, steps, placed = record.task, record.steps, record.placed
    captured = [(int(s["index"]), s["capture"]) for s in steps if s["capture"] is not None]
    rollout = rebuild(captured) if captured else None
    by_index = {turn["index"]: turn for turn in rollout.turns} if rollout else {}
    item, group, member = placed if placed is not None else (None, None, None)
    sequence, broken = flattened(rollout.turns) if rollout else (None, None)
    return {
        "task_id": task.id,
        "experiment_id": item.experiment_id if item else None,
        "group_id": group.group_id if group else None,
        "row_id": item.row_id if item else None,
        "arm": item.arm if item else None,
        "attempt": item.attempt if item else None,
        "worker_attempt": task.attempt,
        "model": (task.spec.get("llm") or {}).get("model"),  # raw: any release's row reads
        "status": task.status,
        "finish_reason": task.finish_reason,
        "error": task.error,
        "infrastructure_failure": (
            member.infrastructure_failure if member else _infrastructure(task)
        ),
        "reward": member.reward if member else None,
        "advantage": member.advantage if member else None,
        "advantage_centered": member.advantage_centered if member else None,
        "group_mean": group.mean if group else None,
        "group_std": group.std if group else None,
        "answer": task.answer,
        "captured": rollout is not None,
        "tools": rollout.tools if rollout else None,
        "messages": rollout.messages if rollout else None,
        "mask": [int(g) for g in rollout.generated] if rollout else None,
        "turns": [_turn(step, by_index.get(int(step["index"]))) for step in steps],
        "sequence": sequence,
        "sequence_break": broken,
    }


def _turn(step: Mapping[str, Any], captured: Mapping[str, Any] | None) -> dict[str, Any]:
    action = step["action"]
    return {
        "index": step["index"],
        "thought": step["thought"],
        "reasoning": step["reasoning"],
        "tool_call": action,
        "observation": step["observation"],
        "interrupted": step["interrupted"],
        "message_index": captured["message_index"] if captured else None,
        "request_messages": captured["request_messages"] if captured else None,
        "prompt_token_ids": captured["prompt_token_ids"] if captured else None,
        "completion_token_ids": captured["completion_token_ids"] if captured else None,
        "logprobs": captured["logprobs"] if captured else None,
        "finish_reason": captured["finish_reason"] if captured else None,
    }


def _infrastructure(task: models.Task) -> bool:
    """A finished task that the service failed (not the model's budget, not a cancel)."""
    if task.status in (TaskStatus.queued, TaskStatus.running) or task.finish_reason is None:
        return False
    return FinishReason(task.finish_reason) not in NOT_INFRASTRUCTURE
