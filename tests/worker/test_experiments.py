"""Experiments end to end: a real in-process worker advances them (its `experiments` chore)
and runs their items as ordinary tasks in real sandboxes, with the scripted model.

Each arm plays its own model; its command answers from an input file of the row, so the
right and wrong answers of every row and arm are chosen by the test, and every score,
mean, pass@k and paired comparison below is computed by hand.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiodocker
import httpx
import pytest
from sqlalchemy import func, select

from app.api.app import create_app
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.resources import open_resources
from app.sandbox import DockerHost
from app.sandbox.reaper import TASK_LABEL
from app.scripted import Script, ScriptedLLMServer, Turn
from app.services.experiments import runner as experiment_runner
from app.worker.pool import Worker
from tests.api.conftest import serve
from tests.support.experiments import progress, settled, submit
from tests.worker.conftest import running_worker


@pytest.fixture
async def worker(fast: Settings) -> AsyncIterator[Worker]:
    async with running_worker(fast) as pool:
        yield pool


def answering_from(scripted_llm: ScriptedLLMServer, file: str) -> str:
    """A model that writes \\boxed{<input/file>} as its answer (none without the file)."""
    name = f"exp-{file}-{uuid.uuid4().hex[:8]}"
    command = (
        f"test -f /testbed/input/{file} && "
        f"printf '\\\\boxed{{%s}}' \"$(cat /testbed/input/{file})\" > /testbed/output/answer.txt; "
        "true"
    )
    turns = [Turn("execute_bash", {"command": command}), Turn("submit", {})]
    scripted_llm.add_script(name, Script(turns=turns))
    return name


# row id, ground truth, arm a's answer, arm b's answer (None: b writes none), domain
ROWS = [
    ("q1", "2", "2", "2", "arith"),
    ("q2", "4", "4", "5", "arith"),
    ("q3", "\\frac{1}{2}", "0.5", "1/2", "fractions"),
    ("q4", "9", "8", "9", "arith"),
    ("q5", "10", "10", None, "arith"),
]


def dataset() -> dict[str, Any]:
    rows = []
    for row_id, truth, a, b, domain in ROWS:
        files = {"a.txt": a} | ({"b.txt": b} if b is not None else {})
        rows.append(
            {
                "id": row_id,
                "problem_statement": f"Solve {row_id}.",
                "ground_truth": truth,
                "input_files": files,
                "domain": domain,
            }
        )
    return {"rows": rows}


async def test_two_arms_five_rows_two_attempts_run_to_finished_with_these_scores(
    fast: Settings,
    client: httpx.AsyncClient,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
    worker: Worker,
) -> None:
    model_a = answering_from(scripted_llm, "a.txt")
    model_b = answering_from(scripted_llm, "b.txt")
    model_v = f"exp-vanilla-{uuid.uuid4().hex[:8]}"  # one model call, the same reply each row
    scripted_llm.add_script(model_v, Script([Turn(content="So: \\boxed{9}")], tools="none"))
    body = {
        "name": "e2e",
        "dataset": dataset(),
        "arms": [
            {"name": "sandbox", "task": {"llm": {"model": model_a}}},
            {"name": "other", "task": {"llm": {"model": model_b}}},
            {"name": "vanilla", "mode": "vanilla", "task": {"llm": {"model": model_v}}},
        ],
        "scorer": {"kind": "math"},
        "attempts": 2,
        "concurrency": 4,
    }
    url = await submit(client, body)
    done = await settled(client, url, "finished")
    assert done["progress"] == {
        "sandbox": progress(scored=10),
        "other": progress(scored=8, error=2),
        "vanilla": progress(scored=10),
    }

    results = (await client.get(f"{url}/results")).json()
    a, b, v = results["arms"]
    assert (a["arm"], a["n"], a["mean"]) == ("sandbox", 10, pytest.approx(0.8))
    assert a["pass_at_k"] == {"1": pytest.approx(0.8), "2": pytest.approx(0.8)}
    assert a["errors"] == {}
    assert a["domains"]["arith"]["n"] == 8
    assert a["domains"]["arith"]["mean"] == pytest.approx(0.75)
    assert a["domains"]["fractions"]["mean"] == pytest.approx(1.0)
    assert a["ci95"]["low"] < 0.8 < a["ci95"]["high"]
    assert a["steps"] == {"median": 2.0, "total": 20.0}
    assert a["prompt_tokens"]["total"] > 0
    assert (b["arm"], b["n"], b["mean"]) == ("other", 8, pytest.approx(0.75))
    assert b["errors"] == {"agent": 2}, "q5: no answer"
    assert b["pass_at_k"] == {"1": pytest.approx(0.75), "2": pytest.approx(0.75)}
    assert (v["arm"], v["n"], v["mean"]) == ("vanilla", 10, pytest.approx(0.2)), "only q4 is 9"
    assert v["steps"] == {"median": 1.0, "total": 10.0}
    pair, with_vanilla, other_with_vanilla = results["pairs"]
    assert (pair["a"], pair["b"], pair["n"]) == ("sandbox", "other", 4)
    assert (pair["wins"], pair["ties"], pair["losses"]) == (1, 2, 1), "q2 won, q4 lost"
    assert pair["difference"] == pytest.approx(0.0)
    assert pair["ci95"]["low"] <= 0.0 <= pair["ci95"]["high"]
    assert (with_vanilla["a"], with_vanilla["b"], with_vanilla["n"]) == ("sandbox", "vanilla", 5)
    assert (with_vanilla["wins"], with_vanilla["ties"], with_vanilla["losses"]) == (4, 0, 1)
    assert with_vanilla["difference"] == pytest.approx(0.6)
    assert (other_with_vanilla["n"], other_with_vanilla["difference"]) == (4, pytest.approx(0.5))
    assert (other_with_vanilla["wins"], other_with_vanilla["ties"]) == (2, 2)

    items = (await client.get(f"{url}/items")).json()["items"]
    assert len(items) == 30
    by_key = {(i["row_id"], i["arm"], i["attempt"]): i for i in items}
    assert by_key[("q3", "other", 2)]["score"] == 1.0
    assert by_key[("q3", "other", 2)]["answer"] == "\\boxed{1/2}"
    assert by_key[("q4", "sandbox", 1)]["score"] == 0.0
    assert (by_key[("q5", "other", 1)]["status"], by_key[("q5", "other", 1)]["error_kind"]) == (
        "error",
        "agent",
    )
    assert all(i["steps"] == (1 if i["arm"] == "vanilla" else 2) and i["task_id"] for i in items)
    assert by_key[("q4", "vanilla", 2)]["answer"] == "So: \\boxed{9}"
    table = (await client.get(f"{url}/items", params={"format": "csv"})).text
    lines = list(csv.DictReader(io.StringIO(table)))
    assert len(lines) == 30
    assert lines[0]["row_id"] == "q1"
    assert lines[0]["score"] == "1.0"
    assert {line["task_id"] for line in lines} == {i["task_id"] for i in items}

    # No item started or scored twice: one task per item, each model called once per turn
    # of each of its 10 items, and the chore run again changes nothing.
    assert scripted_llm.requests[model_a] == 20
    assert scripted_llm.requests[model_b] == 20
    assert scripted_llm.requests[model_v] == 10
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(models.Task)) == 30
    async with open_resources(fast) as res:
        assert await experiment_runner.advance_all(res.sessions, res.redis, fast) == 0
    assert (await client.get(f"{url}/items")).json()["items"] == items


async def test_cancel_mid_run_stops_running_items_and_drops_pending_ones(
    client: httpx.AsyncClient, sessions: Sessions, scripted_llm: ScriptedLLMServer, worker: Worker
) -> None:
    slow = f"exp-slow-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(
        slow, Script(turns=[Turn("execute_bash", {"command": "sleep 600"}), Turn("submit", {})])
    )
    body = {
        "name": "cancel me",
        "dataset": {
            "rows": [{"id": i, "problem_statement": "p", "ground_truth": "1"} for i in range(4)]
        },
        "arms": [{"name": "slow", "task": {"llm": {"model": slow}}}],
        "scorer": {"kind": "exact"},
        "concurrency": 2,
    }
    url = f"/v1/experiments/{(await client.post('/v1/experiments', json=body)).json()['id']}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # both started items' tasks are running
        items = (await client.get(f"{url}/items")).json()["items"]
        ids = [i["task_id"] for i in items if i["task_id"]]
        states = [(await client.get(f"/v1/tasks/{t}")).json()["status"] for t in ids]
        if states == ["running", "running"]:
            break
        await asyncio.sleep(0.2)
    else:
        raise AssertionError(f"the first two items never ran: {states}")
    assert (await client.post(f"{url}/cancel")).json()["status"] == "cancelled"
    done = await settled(client, url, "cancelled", timeout_s=60)
    assert done["progress"]["slow"]["cancelled"] == 4
    for task_id in ids:
        task = (await client.get(f"/v1/tasks/{task_id}")).json()
        assert task["status"] == "cancelled"
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(models.Task)) == 2
    assert (await client.post(f"{url}/cancel")).status_code == 202


async def test_a_worker_stopped_mid_run_leaves_the_experiment_to_the_next_one(
    fast: Settings, client: httpx.AsyncClient, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    model = f"exp-restart-{uuid.uuid4().hex[:8]}"
    command = "sleep 2; printf '\\\\boxed{1}' > /testbed/output/answer.txt"
    turns = [Turn("execute_bash", {"command": command}), Turn("submit", {})]
    scripted_llm.add_script(model, Script(turns=turns))
    body = {
        "name": "restart",
        "dataset": {
            "rows": [{"id": i, "problem_statement": "p", "ground_truth": "1"} for i in range(4)]
        },
        "arms": [{"name": "a", "task": {"llm": {"model": model}}}],
        "scorer": {"kind": "math"},
        "concurrency": 2,
    }
    url = f"/v1/experiments/{(await client.post('/v1/experiments', json=body)).json()['id']}"
    first = Worker(fast)
    running = asyncio.create_task(first.run())
    for _ in range(600):
        if len(first.running) == 2:
            break
        await asyncio.sleep(0.1)
    assert len(first.running) == 2, "both started items run on the first worker"
    first.stop()
    first.stop()  # no grace: its attempts are handed back mid-command
    await asyncio.wait_for(running, 60)

    second = Worker(fast)
    resumed = asyncio.create_task(second.run())
    try:
        done = await settled(client, url, "finished")
    finally:
        second.stop()
        await asyncio.wait_for(resumed, 60)
    assert done["progress"]["a"]["scored"] == 4
    items = (await client.get(f"{url}/items")).json()["items"]
    assert [item["score"] for item in items] == [1.0] * 4
    async with sessions() as session:
        attempts = sorted(await session.scalars(select(models.Task.attempt)))
    assert attempts == [1, 1, 2, 2], "one task per item; the two handed back ran again"


async def test_an_item_ending_starts_the_next_one_without_waiting_for_the_tick(
    settings: Settings, scripted_llm: ScriptedLLMServer
) -> None:
    """One item at a time and a tick of an hour: only the wake-up of an ended attempt can
    carry the experiment past its first item (created by the API's own first advance)."""
    slow_tick = settings.model_copy(update={"experiment_tick_s": 3600.0, "worker_concurrency": 2})
    model = f"exp-wake-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(model, Script([Turn(content="\\boxed{2}")], tools="none"))
    rows = [
        {"id": f"w{i}", "problem_statement": "What is 1 + 1?", "ground_truth": "2"}
        for i in range(4)
    ]
    body = {
        "name": "wake",
        "dataset": {"rows": rows},
        "arms": [{"name": "v", "mode": "vanilla", "task": {"llm": {"model": model}}}],
        "scorer": {"kind": "math"},
        "concurrency": 1,
    }
    async with serve(create_app(slow_tick)) as client, running_worker(slow_tick):
        url = await submit(client, body)
        done = await settled(client, url, "finished", timeout_s=60)
    assert done["progress"] == {"v": progress(scored=4)}


async def test_an_item_the_service_failed_runs_again_and_one_it_keeps_failing_is_not_scored(
    fast: Settings,
    client: httpx.AsyncClient,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
    worker: Worker,
) -> None:
    """The model server refuses the first call of `flaky` (its first item's task ends
    `llm_error`) and every call of `down`. With one retry, `flaky`'s item runs again and is
    scored; `down`'s two are retried once each, then end not scored: never a 0, out of the
    mean, and counted in the arm's coverage."""
    flaky = f"flaky-{uuid.uuid4().hex[:8]}"
    down = f"down-{uuid.uuid4().hex[:8]}"
    reply = [Turn(content="\\boxed{4}")]
    scripted_llm.add_script(flaky, Script(reply, tools="none", fail_status=400, fail_count=1))
    scripted_llm.add_script(down, Script(reply, tools="none", fail_status=400))
    rows = [{"id": f"q{i}", "problem_statement": "2 + 2?", "ground_truth": "4"} for i in (1, 2)]
    body = {
        "name": "retries",
        "dataset": {"rows": rows},
        "arms": [
            {"name": "flaky", "mode": "vanilla", "task": {"llm": {"model": flaky}}},
            {"name": "down", "mode": "vanilla", "task": {"llm": {"model": down}}},
        ],
        "scorer": {"kind": "math"},
        "concurrency": 1,
        "infrastructure_retries": 1,
    }
    url = await submit(client, body)
    done = await settled(client, url, "finished")
    assert done["infrastructure_retries"] == 1
    assert done["progress"] == {
        "flaky": progress(scored=2),
        "down": progress(error=2, not_scored=2),
    }
    items = {(i["arm"], i["row_id"]): i for i in (await client.get(f"{url}/items")).json()["items"]}
    assert [items[("flaky", q)]["retries"] for q in ("q1", "q2")] == [1, 0]
    assert items[("flaky", "q1")]["score"] == 1.0
    for q in ("q1", "q2"):
        failed = items[("down", q)]
        assert (failed["status"], failed["error_kind"], failed["score"]) == (
            "error",
            "infrastructure",
            None,
        )
        assert (failed["retries"], failed["detail"]["reason"]) == (1, "llm_error")
    results = (await client.get(f"{url}/results")).json()
    by_arm = {arm["arm"]: arm for arm in results["arms"]}
    assert by_arm["flaky"]["coverage"] == {
        "items": 2,
        "scored": 2,
        "agent_errors": 0,
        "not_scored": 0,
        "unfinished": 0,
        "cancelled": 0,
        "retried": 1,
    }
    assert (by_arm["down"]["mean"], by_arm["down"]["n"]) == (None, 0), "not a 0"
    assert by_arm["down"]["coverage"]["not_scored"] == 2
    assert by_arm["down"]["coverage"]["retried"] == 2
    assert results["pairs"] == [], "no row scored in both arms"
    events = [
        json.loads(line[len("data:") :])
        for line in (await client.get(f"{url}/events", params={"after": 0})).text.splitlines()
        if line.startswith("data:")
    ]
    retried = [e["data"] for e in events if e["type"] == "item.retried"]
    assert sorted((e["arm"], e["row_id"], e["reason"], e["retries"]) for e in retried) == [
        ("down", "q1", "llm_error", 1),
        ("down", "q2", "llm_error", 1),
        ("flaky", "q1", "llm_error", 1),
    ]
    async with sessions() as session:  # the failed tasks stay; each item links its last one
        count = await session.scalar(select(func.count()).select_from(models.Task))
    assert count == 4 + 3


async def test_an_item_whose_sandbox_is_killed_runs_again_in_a_new_one(
    client: httpx.AsyncClient, scripted_llm: ScriptedLLMServer, worker: Worker
) -> None:
    """The item's container is killed mid-command (`docker kill`, as an OOM or a daemon
    restart would): its task ends `sandbox_error`, the item runs again in a new sandbox
    and is scored: the failure costs a retry, never a 0."""
    marker = f"killme-{uuid.uuid4().hex[:8]}"
    command = f"echo {marker}; sleep 4; printf '\\\\boxed{{4}}' > /testbed/output/answer.txt"
    model = f"killed-{uuid.uuid4().hex[:8]}"
    turns = [Turn("execute_bash", {"command": command}), Turn("submit", {})]
    scripted_llm.add_script(model, Script(turns=turns, repeat_last=False))
    body = {
        "name": "killed sandbox",
        "dataset": {"rows": [{"id": "q1", "problem_statement": "2 + 2?", "ground_truth": "4"}]},
        "arms": [{"name": "s", "task": {"llm": {"model": model}}}],
        "scorer": {"kind": "math"},
        "infrastructure_retries": 1,
    }
    url = await submit(client, body)
    (item,) = (await client.get(f"{url}/items")).json()["items"]
    first = item["task_id"]
    deadline = time.monotonic() + 60
    killed: list[str] = []
    async with DockerHost() as docker:
        while not killed and time.monotonic() < deadline:
            task = (await client.get(f"/v1/tasks/{first}")).json()
            if task["status"] == "running" and task["usage"]["steps"] == 0:
                for container in await docker.list_sandboxes({TASK_LABEL: first}):
                    try:
                        await docker.api().containers.container(container).kill()
                    except aiodocker.exceptions.DockerError as error:
                        # Created but not started yet (409): try again on the next poll.
                        if error.status != 409:
                            raise
                        continue
                    killed.append(container)
            await asyncio.sleep(0.2)
    assert killed, "the item's sandbox never ran"
    done = await settled(client, url, "finished")
    assert done["progress"]["s"] == progress(scored=1)
    (item,) = (await client.get(f"{url}/items")).json()["items"]
    assert (item["score"], item["retries"]) == (1.0, 1)
    assert item["task_id"] != first
    failed = (await client.get(f"/v1/tasks/{first}")).json()
    assert (failed["status"], failed["finish_reason"]) == ("failed", "sandbox_error")
