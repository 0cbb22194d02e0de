"""The experiment export reads a page of items at a time: a group's attempts lie pages apart
(items start attempt by attempt), yet each line's group and advantage are those of the
whole group, as `/results` computes them over every item at once."""

from __future__ import annotations

import json
from typing import Any

from app.db import models
from app.db.engine import Sessions
from app.ids import utc_now
from app.services.experiments.results import get_results
from app.services.experiments.rows import store_rows
from app.services.rollouts.export import open_experiment_export

EXP = "exp_pages"
ROWS = 5
ARMS = ("a", "b")
ATTEMPTS = 3
PRUNED = {"tsk_a_r1_2"}
"""A started item whose task was pruned since: no line."""
PENDING = {("b", "r4", 3)}
"""An item not started: no task, no line."""


def outcome(arm: str, row: int, attempt: int) -> dict[str, Any]:
    """Scores that differ by arm, row and attempt, an agent error and an infrastructure one."""
    if (arm, row, attempt) == ("a", 2, 2):
        return {"status": "error", "error_kind": "agent"}
    if (arm, row, attempt) == ("b", 0, 1):
        return {"status": "error", "error_kind": "infrastructure"}
    return {"status": "scored", "score": ((row + attempt * (arm == "a")) % 3) / 2}


async def fill(sessions: Sessions) -> list[str]:
    """The experiment, its tasks (two of them with steps of two worker attempts) and items;
    the task ids in start order, pruned ones included."""
    now = utc_now()
    spec = {
        "arms": [{"name": arm, "mode": "sandbox"} for arm in ARMS],
        "scorer": {"kind": "exact"},
        "attempts": ATTEMPTS,
        "concurrency": 4,
    }
    started: list[str] = []
    async with sessions.begin() as session:
        session.add(
            models.Experiment(
                id=EXP, tenant_id="t1", name="pages", status="finished", spec=spec, meta={}
            )
        )
        await session.flush()
        await store_rows(
            session,
            EXP,
            [{"id": f"r{r}", "problem_statement": "p", "ground_truth": "1"} for r in range(ROWS)],
        )
        seq = 0
        for attempt in range(1, ATTEMPTS + 1):
            for row in range(ROWS):
                for arm in ARMS:
                    task_id = None
                    if (arm, f"r{row}", attempt) not in PENDING:
                        task_id = f"tsk_{arm}_r{row}_{attempt}"
                        started.append(task_id)
                    if task_id is not None and task_id not in PRUNED:
                        session.add(
                            models.Task(
                                id=task_id,
                                tenant_id="t1",
                                status="succeeded",
                                finish_reason="submitted",
                                prompt="p",
                                spec={"llm": {"model": "m"}},
                                attempt=2 if row == 0 else 1,
                                answer=f"answer of {task_id}",
                                usage={},
                                started_at=now,
                                finished_at=now,
                            )
                        )
                    session.add(
                        models.ExperimentItem(
                            experiment_id=EXP,
                            row_id=f"r{row}",
                            arm=arm,
                            attempt=attempt,
                            seq=seq,
                            task_id=task_id,
                            detail={},
                            updated_at=now,
                            **outcome(arm, row, attempt),
                        )
                    )
                    seq += 1
        await session.flush()
        for task_id in started:
            if task_id.endswith(("_r0_1", "_r0_3")):
                for worker_attempt in (1, 2):  # handed back once: the line has attempt 2's
                    for index in range(worker_attempt + 1):
                        session.add(
                            models.Step(
                                task_id=task_id,
                                attempt=worker_attempt,
                                index=index,
                                thought=f"{task_id} attempt {worker_attempt} step {index}",
                                started_at=now,
                            )
                        )
    return started


async def lines(sessions: Sessions, page: int) -> list[str]:
    return [line async for line in await open_experiment_export(sessions, "t1", EXP, page=page)]


async def test_pages_of_items_export_what_one_read_of_every_item_would(
    sessions: Sessions,
) -> None:
    started = await fill(sessions)
    whole = await lines(sessions, page=10_000)
    assert await lines(sessions, page=3) == whole, "a page boundary changes no byte"
    exported = [json.loads(line) for line in whole]
    assert [line["task_id"] for line in exported] == [t for t in started if t not in PRUNED]
    results = await get_results(sessions, "t1", EXP)
    groups = {group.group_id: group for group in results.groups}
    for line in exported:
        group = groups[line["group_id"]]
        (rollout,) = [r for r in group.rollouts if r.task_id == line["task_id"]]
        assert (line["group_mean"], line["group_std"]) == (group.mean, group.std)
        assert (line["reward"], line["advantage"]) == (rollout.reward, rollout.advantage)
        assert line["infrastructure_failure"] == rollout.infrastructure_failure
        assert line["answer"] == f"answer of {line['task_id']}"
    by_task = {line["task_id"]: line for line in exported}
    assert by_task["tsk_a_r2_2"]["reward"] == 0.0, "an agent error is a failure"
    assert by_task["tsk_b_r0_1"]["reward"] is None, "infrastructure: masked"
    assert by_task["tsk_b_r0_1"]["infrastructure_failure"] is True
    assert [turn["thought"] for turn in by_task["tsk_a_r0_3"]["turns"]] == [
        f"tsk_a_r0_3 attempt 2 step {i}" for i in range(3)
    ], "the last worker attempt's steps, in order, and no other task's"
    assert by_task["tsk_b_r1_1"]["turns"] == []
