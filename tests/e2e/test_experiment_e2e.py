"""Experiments through the real service: `python -m app serve` and `worker` processes,
Postgres, a private Redis, Docker sandboxes and a scripted model (issue 15, "Done means").

The model (`tests.support.prompted_llm`) answers by row and by how often the row was
asked, so each row's answers per arm are chosen here and every number below is computed by
hand in the comments, never by the app's own statistics. Then the worker is SIGKILLed
mid-experiment and another finishes it with no item run into a second task or scored
twice, and an experiment is cancelled mid-run.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app.config import Settings
from app.scripted import Script, Turn
from tests.e2e.fault_harness import (
    check_consistency,
    cluster_with_api,
    containers,
    db_events,
    fault_settings,
    wait_until,
)
from tests.support.private_redis import PrivateRedis
from tests.support.prompted_llm import PromptedLLMServer, row_tag

ANSWER_FILE = "/testbed/output/answer.txt"


@pytest.fixture
def model() -> Iterator[PromptedLLMServer]:
    with PromptedLLMServer() as server:
        yield server


@pytest.fixture
def config(settings: Settings, private_redis: PrivateRedis, model: PromptedLLMServer) -> Settings:
    return fault_settings(
        settings,
        private_redis.url,
        llm_base_url=model.base_url,
        experiment_tick_s=0.2,
        worker_concurrency=6,
    )


def writes(answer: str, command: str = "true") -> Script:
    """A sandbox agent that runs `command`, writes \\boxed{answer} and submits."""
    text = f"\\boxed{{{answer}}}"
    script = f"{command}; printf '%s' '{text}' > {ANSWER_FILE}"
    return Script([Turn("execute_bash", {"command": script}), Turn("submit", {})])


NO_ANSWER = Script([Turn("execute_bash", {"command": "true"}), Turn("submit", {})])
"""Submits without writing output/answer.txt: the item is an `agent` error."""


def replies(answer: str) -> Script:
    """A vanilla reply (one model call, no tools)."""
    return Script(
        [Turn(content=f"Thinking done. The answer is \\boxed{{{answer}}}.")], tools="none"
    )


def row(row_id: str, truth: str, domain: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {
        "id": row_id,
        "problem_statement": f"{row_tag(row_id)} Compute the value asked.",
        "ground_truth": truth,
    }
    if domain is not None:
        found["domain"] = domain
    return found


def items_of(client: httpx.Client, experiment_id: str) -> list[dict[str, Any]]:
    answer = client.get(f"/v1/experiments/{experiment_id}/items")
    assert answer.status_code == 200, answer.text
    items: list[dict[str, Any]] = answer.json()["items"]
    return items


def until_settled(client: httpx.Client, experiment_id: str, status: str, timeout_s: float) -> Any:
    """The experiment once it has `status` and no item is still on its way."""

    def settled() -> Any:
        exp = client.get(f"/v1/experiments/{experiment_id}").json()
        moving = any(arm.get(state) for arm in exp["progress"].values() for state in UNDER_WAY)
        return exp if exp["status"] == status and not moving else None

    return wait_until(f"experiment {experiment_id} {status}", settled, timeout_s, 0.3)


UNDER_WAY = ("pending", "running", "scoring")


def counts(progress: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Per arm, the item states that have items (so a new state with none changes nothing)."""
    return {arm: {state: n for state, n in by.items() if n} for arm, by in progress.items()}


def sql(settings: Settings, query: str, *args: Any) -> list[asyncpg.Record]:
    async def fetch() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(settings.database_url.replace("+asyncpg", ""))
        try:
            return list(await conn.fetch(query, *args))
        finally:
            await conn.close()

    return asyncio.run(fetch())


def tasks_of(settings: Settings, experiment_id: str) -> dict[str, asyncpg.Record]:
    """Every task linked to the experiment (by the metadata each item's task carries)."""
    rows = sql(
        settings,
        "SELECT id, status, attempt, metadata::text AS metadata FROM tasks"
        " WHERE metadata->>'experiment' = $1",
        experiment_id,
    )
    return {r["id"]: r for r in rows}


def assert_one_task_per_item(
    settings: Settings, experiment_id: str, items: list[dict[str, Any]]
) -> dict[str, asyncpg.Record]:
    """Every started item has its own task, and the experiment has no other task."""
    task_ids = [item["task_id"] for item in items if item["task_id"] is not None]
    assert len(task_ids) == len(set(task_ids)), "a task shared by two items"
    tasks = tasks_of(settings, experiment_id)
    assert set(tasks) == set(task_ids), "tasks of the experiment that no item points to"
    for item in items:
        if item["task_id"] is not None:
            meta = json.loads(tasks[item["task_id"]]["metadata"])
            assert (meta["row"], meta["arm"], meta["attempt"]) == (
                item["row_id"],
                item["arm"],
                item["attempt"],
            )
    return tasks


def assert_each_item_started_and_ended_once(
    settings: Settings, experiment_id: str, items: list[dict[str, Any]], last: str
) -> None:
    """The experiment's event log: gapless, one `item.started` per task made, one `item.ended`
    per item saying how it ended (so none was started or scored twice), then `last`."""
    events = [
        {"seq": r["seq"], "type": r["type"], "data": json.loads(r["data"])}
        for r in sql(
            settings,
            "SELECT seq, type, data::text AS data FROM experiment_events"
            " WHERE experiment_id = $1 ORDER BY seq",
            experiment_id,
        )
    ]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), "gapless"

    def key(data: dict[str, Any]) -> tuple[str, str, int]:
        return (str(data["row_id"]), data["arm"], data["attempt"])

    started = Counter(key(e["data"]) for e in events if e["type"] == "item.started")
    assert started == Counter(key(i) for i in items if i["task_id"] is not None)
    ended = {}
    for event in events:
        if event["type"] == "item.ended":
            assert key(event["data"]) not in ended, f"{key(event['data'])} ended twice"
            ended[key(event["data"])] = event["data"]
    assert set(ended) == {key(i) for i in items}
    for item in items:
        data = ended[key(item)]
        assert (data["status"], data["score"], data["error_kind"], data["task_id"]) == (
            item["status"],
            item["score"],
            item["error_kind"],
            item["task_id"],
        ), item
    ends = [e["type"] for e in events if e["type"].startswith("experiment.")]
    assert ends == [last], ends
    if last == "experiment.finished":  # after a cancel, the stopped items end later
        assert events[-1]["type"] == last, "nothing happens after the end"


def wait_no_sandboxes(settings: Settings) -> None:
    label = f"sandhive.instance={settings.instance_name()}"
    wait_until("the sandboxes to go", lambda: not containers(label), 60)


# 1. Two arms x 20 rows x 2 attempts, every number known in advance

RIGHT, WRONG, NONE = "right", "wrong", "none"
# Per row: (ground truth, domain, sandbox's two answers, vanilla's two answers), each answer
# right, wrong or none (no answer file). Which attempt gets which answer is up to the
# scheduler (the model answers the row's first task with the first one); a row's pair is
# what is fixed, and all the results below depend only on that.
PLAN: dict[str, tuple[str, str, tuple[str, str], tuple[str, str]]] = {
    # r01's truth is 0.75 and its right answer \frac{3}{4}: the math scorer's equivalence.
    "r01": ("0.75", "algebra", (RIGHT, RIGHT), (RIGHT, RIGHT)),
    **{f"r{i:02}": (str(10 * i), "algebra", (RIGHT, RIGHT), (RIGHT, RIGHT)) for i in (2, 3, 4, 5)},
    **{f"r{i:02}": (str(10 * i), "algebra", (RIGHT, RIGHT), (WRONG, RIGHT)) for i in (6, 7, 8)},
    **{f"r{i:02}": (str(10 * i), "algebra", (RIGHT, RIGHT), (WRONG, WRONG)) for i in (9, 10)},
    "r11": ("110", "geometry", (RIGHT, WRONG), (WRONG, WRONG)),
    "r12": ("120", "geometry", (WRONG, RIGHT), (WRONG, WRONG)),
    "r13": ("130", "geometry", (RIGHT, WRONG), (WRONG, WRONG)),
    "r14": ("140", "geometry", (WRONG, RIGHT), (WRONG, WRONG)),
    "r15": ("150", "geometry", (WRONG, WRONG), (RIGHT, RIGHT)),
    "r16": ("160", "geometry", (WRONG, WRONG), (RIGHT, WRONG)),
    "r17": ("170", "geometry", (WRONG, WRONG), (WRONG, WRONG)),
    "r18": ("180", "geometry", (NONE, RIGHT), (WRONG, WRONG)),
    "r19": ("190", "geometry", (NONE, RIGHT), (WRONG, WRONG)),
    "r20": ("200", "geometry", (NONE, NONE), (WRONG, WRONG)),
}


def answer_for(row_id: str, kind: str) -> str:
    truth = PLAN[row_id][0]
    if row_id == "r01":
        return "\\frac{3}{4}" if kind == RIGHT else "\\frac{1}{4}"
    return truth if kind == RIGHT else str(int(truth) + 1)


def test_two_arms_twenty_rows_two_attempts_end_with_the_hand_computed_results(
    config: Settings, model: PromptedLLMServer, tmp_path: Path
) -> None:
    sandbox_model = f"e2e-exp-sandbox-{uuid.uuid4().hex[:8]}"
    vanilla_model = f"e2e-exp-vanilla-{uuid.uuid4().hex[:8]}"
    model.book.plan(
        sandbox_model,
        {
            r: [NO_ANSWER if kind == NONE else writes(answer_for(r, kind)) for kind in plan[2]]
            for r, plan in PLAN.items()
        },
    )
    model.book.plan(
        vanilla_model,
        {r: [replies(answer_for(r, kind)) for kind in plan[3]] for r, plan in PLAN.items()},
    )
    body = {
        "name": "e2e: sandbox vs vanilla",
        "dataset": {"rows": [row(r, plan[0], plan[1]) for r, plan in PLAN.items()]},
        "arms": [
            {"name": "sandbox", "mode": "sandbox", "task": {"llm": {"model": sandbox_model}}},
            {"name": "vanilla", "mode": "vanilla", "task": {"llm": {"model": vanilla_model}}},
        ],
        "scorer": {"kind": "math"},
        "attempts": 2,
        "concurrency": 12,
        "metadata": {"suite": "e2e"},
    }
    with cluster_with_api(config, tmp_path) as (procs, client):
        procs.start_worker("worker-1")
        created = client.post("/v1/experiments", json=body)
        assert created.status_code == 202, created.text
        exp_id = created.json()["id"]
        done = until_settled(client, exp_id, "finished", timeout_s=150)

        # sandbox: scored = 20 rows x 2 - 4 without an answer (r18, r19 once, r20 twice).
        assert counts(done["progress"]) == {
            "sandbox": {"scored": 36, "error": 4},
            "vanilla": {"scored": 40},
        }, procs.logs()
        results = client.get(f"/v1/experiments/{exp_id}/results").json()
        items = items_of(client, exp_id)
    assert model.failures == []
    assert results["status"] == "finished"
    sandbox, vanilla = results["arms"]

    # sandbox, right answers among the 36 scored: r01-r10 2 each (20), r11-r14 1 each (4),
    # r15-r17 none, r18-r19 1 each (2): 26 / 36 of the items. `mean` is mean@k over the 19
    # rows with a scored attempt (r20 has none): (10 x 1 + 4 x 1/2 + 3 x 0 + 2 x 1) / 19.
    assert (sandbox["arm"], sandbox["n"], sandbox["rows"]) == ("sandbox", 36, 19)
    assert sandbox["mean"] == pytest.approx(14 / 19)
    assert sandbox["ci95"]["low"] < 14 / 19 < sandbox["ci95"]["high"]
    assert sandbox["ci95_method"] == "bootstrap", "row means of 1/2 are not pass/fail"
    assert sandbox["errors"] == {"agent": 4}, "errors counted apart, not as zeros"
    assert sandbox["cancelled"] == 0
    # pass@k over the 17 rows with both attempts scored (r01-r17; r18-r20 lack one):
    # c right of n = 2 per row; pass@1 = mean of c/2 = (10 x 1 + 4 x 1/2 + 3 x 0) / 17
    # = 12/17; pass@2 = 1 - C(2-c, 2)/C(2, 2) = 1 when c >= 1: (10 + 4) / 17 = 14/17.
    assert sandbox["pass_at_k"] == {"1": pytest.approx(12 / 17), "2": pytest.approx(14 / 17)}
    # per domain: algebra r01-r10, 20 scored, all right; geometry r11-r20, 16 scored
    # (14 of r11-r17, 2 of r18-r19) in 9 rows: (4 x 1/2 + 3 x 0 + 2 x 1) / 9.
    assert sandbox["domains"]["algebra"]["n"] == 20
    assert sandbox["domains"]["algebra"]["mean"] == pytest.approx(1.0)
    assert (sandbox["domains"]["geometry"]["n"], sandbox["domains"]["geometry"]["rows"]) == (16, 9)
    assert sandbox["domains"]["geometry"]["mean"] == pytest.approx(4 / 9)
    # Every sandbox item took 2 steps (a command, then submit); all 40 ran.
    assert sandbox["steps"] == {"median": 2.0, "total": 80.0}
    assert sandbox["prompt_tokens"]["total"] > 0

    # vanilla, right answers among 40: r01-r05 2 each (10), r06-r08 1 each (3), r15 2,
    # r16 1: 16 / 40 = 0.4.
    assert (vanilla["arm"], vanilla["n"], vanilla["errors"]) == ("vanilla", 40, {})
    assert vanilla["mean"] == pytest.approx(0.4)
    assert vanilla["ci95"]["low"] < 0.4 < vanilla["ci95"]["high"]
    # pass@1 over all 20 rows = (5 x 1 + 3 x 1/2 + 1 + 1/2) / 20 = 8/20 = 0.4;
    # pass@2 = rows with a right answer (r01-r08, r15, r16) = 10/20 = 0.5.
    assert vanilla["pass_at_k"] == {"1": pytest.approx(0.4), "2": pytest.approx(0.5)}
    # algebra: r01-r05 10 + r06-r08 3 = 13 of 20; geometry: r15 2 + r16 1 = 3 of 20.
    assert vanilla["domains"]["algebra"]["mean"] == pytest.approx(13 / 20)
    assert vanilla["domains"]["geometry"]["mean"] == pytest.approx(3 / 20)
    assert vanilla["steps"] == {"median": 1.0, "total": 40.0}, "one model call each"

    # The pair, on the 19 rows both arms scored (r20's sandbox has none), a row's score
    # being its scored attempts' mean:
    #   row      sandbox  vanilla  difference
    #   r01-r05  1        1         0      5 ties
    #   r06-r08  1        1/2      +1/2    3 wins
    #   r09-r10  1        0        +1      2 wins
    #   r11-r14  1/2      0        +1/2    4 wins
    #   r15      0        1        -1      loss
    #   r16      0        1/2      -1/2    loss
    #   r17      0        0         0      tie
    #   r18-r19  1        0        +1      2 wins (their one scored attempt)
    # mean_a = (10 + 4 x 1/2 + 2) / 19 = 14/19; mean_b = (5 + 3 x 1/2 + 1 + 1/2) / 19 = 8/19;
    # difference = 6/19 (= 3/2 + 2 + 2 - 1 - 1/2 + 2 over 19); 11 wins, 6 ties, 2 losses.
    [pair] = results["pairs"]
    assert (pair["a"], pair["b"], pair["n"]) == ("sandbox", "vanilla", 19)
    assert pair["mean_a"] == pytest.approx(14 / 19)
    assert pair["mean_b"] == pytest.approx(8 / 19)
    assert pair["difference"] == pytest.approx(6 / 19)
    assert (pair["wins"], pair["ties"], pair["losses"]) == (11, 6, 2)
    assert -1 <= pair["ci95"]["low"] <= 6 / 19 <= pair["ci95"]["high"] <= 1
    # 19 rows are too few for a bootstrap: Hoeffding's interval, 6/19 +- 2 sqrt(ln 40 / 38),
    # holds 0; the sign test, 11 wins of 13, p = 2 (1 + 13 + 78) / 2^13.
    assert pair["ci95_method"] == "hoeffding"
    assert pair["ci95"]["low"] == pytest.approx(6 / 19 - 2 * math.sqrt(math.log(40) / 38))
    assert pair["p_value"] == pytest.approx(184 / 8192)
    assert pair["verdict"] == "no_clear_difference"

    # Item by item: each row's pair of outcomes per arm is the planned one.
    assert len(items) == 80
    outcomes: dict[tuple[str, str], list[Any]] = {}
    for item in items:
        outcome = item["score"] if item["status"] == "scored" else item["error_kind"]
        outcomes.setdefault((item["row_id"], item["arm"]), []).append(outcome)
    value = {RIGHT: 1.0, WRONG: 0.0, NONE: "agent"}
    for r, plan in PLAN.items():
        for arm, planned in (("sandbox", plan[2]), ("vanilla", plan[3])):
            got = sorted(outcomes[(r, arm)], key=str)
            assert got == sorted((value[kind] for kind in planned), key=str), (r, arm)
    by_key = {(i["row_id"], i["arm"], i["attempt"]): i for i in items}
    assert {by_key[("r01", "sandbox", a)]["answer"] for a in (1, 2)} == {"\\boxed{\\frac{3}{4}}"}
    assert "no answer" in by_key[("r20", "sandbox", 1)]["detail"]["message"]
    assert by_key[("r15", "vanilla", 1)]["answer"] == ("Thinking done. The answer is \\boxed{150}.")
    assert all(i["steps"] == (2 if i["arm"] == "sandbox" else 1) for i in items)

    # One task per item and no other; each model asked each row exactly twice (no re-run).
    tasks = assert_one_task_per_item(config, exp_id, items)
    assert len(tasks) == 80
    assert {t["status"] for t in tasks.values()} == {"succeeded"}
    assert {t["attempt"] for t in tasks.values()} == {1}
    for r in PLAN:
        assert model.book.asked(sandbox_model, r) == 2, r
        assert model.book.asked(vanilla_model, r) == 2, r
    assert model.requests[sandbox_model] == 80, "two turns per sandbox task"
    assert model.requests[vanilla_model] == 40
    assert_each_item_started_and_ended_once(config, exp_id, items, "experiment.finished")


# 2. The worker SIGKILLed mid-experiment


def test_a_sigkilled_worker_leaves_the_experiment_to_another_with_nothing_run_or_scored_twice(
    config: Settings, model: PromptedLLMServer, private_redis: PrivateRedis, tmp_path: Path
) -> None:
    name = f"e2e-exp-kill-{uuid.uuid4().hex[:8]}"
    rows = [row(f"k{i:02}", str(i)) for i in range(1, 13)]
    # Even rows answered right, odd ones wrong (the same on a re-run): mean 6/12.
    model.book.plan(
        name,
        {
            r["id"]: [writes(str(int(r["ground_truth"]) + int(r["id"][1:]) % 2), "sleep 2")]
            for r in rows
        },
    )
    body = {
        "name": "e2e: killed worker",
        "dataset": {"rows": rows},
        "arms": [{"name": "sandbox", "task": {"llm": {"model": name}}}],
        "scorer": {"kind": "math"},
        "concurrency": 4,
    }
    with cluster_with_api(config, tmp_path) as (procs, client):
        doomed = procs.start_worker("doomed", worker_concurrency=4)
        exp_id = client.post("/v1/experiments", json=body).json()["id"]

        def mid_run() -> bool:
            progress = client.get(f"/v1/experiments/{exp_id}").json()["progress"]["sandbox"]
            started = [t for t in tasks_of(config, exp_id).values() if t["status"] == "running"]
            return progress["scored"] >= 2 and progress["pending"] >= 2 and len(started) >= 2

        wait_until("some items scored, some running, some pending", mid_run, 90, 0.1)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=10)
        # Nothing advances the experiment while no worker runs: this is the state it died in.
        before = {(i["row_id"], i["attempt"]): i for i in items_of(client, exp_id)}
        tasks_before = tasks_of(config, exp_id)
        status_of_task = {t: r["status"] for t, r in tasks_before.items()}
        scored_before = {k: i for k, i in before.items() if i["status"] == "scored"}
        on_the_dead = {
            k for k, i in before.items() if status_of_task.get(i["task_id"]) == "running"
        }
        pending_before = {k for k, i in before.items() if i["status"] == "pending"}
        assert scored_before, before
        assert on_the_dead, before
        assert pending_before, before

        procs.start_worker("rescuer", worker_concurrency=4)
        done = until_settled(client, exp_id, "finished", timeout_s=120)
        assert counts(done["progress"]) == {"sandbox": {"scored": 12}}, procs.logs()
        results = client.get(f"/v1/experiments/{exp_id}/results").json()
        after = {(i["row_id"], i["attempt"]): i for i in items_of(client, exp_id)}
        wait_no_sandboxes(config)
    assert model.failures == []
    # k02, k04, ... k12 right: 6 of 12.
    assert (results["arms"][0]["n"], results["arms"][0]["mean"]) == (12, pytest.approx(0.5))

    items = list(after.values())
    tasks = assert_one_task_per_item(config, exp_id, items)
    assert len(tasks) == 12, "one task per item, none made again for the reclaimed ones"
    for key, item in scored_before.items():
        assert after[key] == item, f"{key} was scored before the kill and never again"
    for key in on_the_dead:
        # The dead worker's tasks were reclaimed once their lease expired and ran again as
        # attempt 2 (docs/operations.md, Reliability), and their items were then scored.
        task_id = after[key]["task_id"]
        assert task_id == before[key]["task_id"], "the same task, not a new one"
        assert tasks[task_id]["attempt"] == 2, key
        started = [
            e["data"]
            for e in db_events(config.database_url, task_id)
            if e["type"] == "task.started"
        ]
        assert [(s["attempt"], s["worker"]) for s in started] == [(1, "doomed"), (2, "rescuer")]
        assert after[key]["status"] == "scored"
    for key in pending_before:
        assert tasks[after[key]["task_id"]]["attempt"] == 1, "started only by the rescuer"
        assert model.book.asked(name, key[0]) == 1, key
    for key in before:
        assert model.book.asked(name, key[0]) <= (2 if key in on_the_dead else 1), key
    for item in items:
        assert item["score"] == (1.0 if int(item["row_id"][1:]) % 2 == 0 else 0.0), item
    assert_each_item_started_and_ended_once(config, exp_id, items, "experiment.finished")
    check_consistency(config, list(tasks), private_redis.client())


# 3. Cancel mid-run


def test_cancel_mid_run_ends_pending_and_running_items_cancelled_and_keeps_the_scores(
    config: Settings, model: PromptedLLMServer, private_redis: PrivateRedis, tmp_path: Path
) -> None:
    name = f"e2e-exp-cancel-{uuid.uuid4().hex[:8]}"
    rows = [row(f"c{i}", "7") for i in range(1, 9)]
    # c1 right and c2 wrong at once; every later row is still in its command when cancelled.
    model.book.plan(
        name,
        {
            "c1": [writes("7")],
            "c2": [writes("8")],
            **{r["id"]: [writes("7", "sleep 600")] for r in rows[2:]},
        },
    )
    body = {
        "name": "e2e: cancelled",
        "dataset": {"rows": rows},
        "arms": [{"name": "sandbox", "task": {"llm": {"model": name}}}],
        "scorer": {"kind": "math"},
        "concurrency": 2,
    }
    with cluster_with_api(config, tmp_path) as (procs, client):
        procs.start_worker("worker-1")
        exp_id = client.post("/v1/experiments", json=body).json()["id"]

        def two_scored_two_running() -> bool:
            progress = client.get(f"/v1/experiments/{exp_id}").json()["progress"]["sandbox"]
            running = [t for t in tasks_of(config, exp_id).values() if t["status"] == "running"]
            return progress["scored"] == 2 and len(running) == 2

        wait_until("c1, c2 scored and c3, c4 running", two_scored_two_running, 90, 0.1)
        wait_until(
            "c3, c4 in their command",
            lambda: [model.book.asked(name, r) for r in ("c3", "c4")] == [1, 1],
            30,
        )
        cancelled = client.post(f"/v1/experiments/{exp_id}/cancel")
        assert cancelled.status_code == 202, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        done = until_settled(client, exp_id, "cancelled", timeout_s=60)
        assert counts(done["progress"]) == {"sandbox": {"scored": 2, "cancelled": 6}}, procs.logs()
        results = client.get(f"/v1/experiments/{exp_id}/results")
        items = items_of(client, exp_id)
        again = client.post(f"/v1/experiments/{exp_id}/cancel")
        wait_no_sandboxes(config)
    by_row = {item["row_id"]: item for item in items}
    assert [by_row[r]["score"] for r in ("c1", "c2")] == [1.0, 0.0]
    tasks = assert_one_task_per_item(config, exp_id, items)
    assert len(tasks) == 4, "c5-c8 never got a task"
    for r in ("c3", "c4"):
        assert by_row[r]["status"] == "cancelled"
        assert tasks[by_row[r]["task_id"]]["status"] == "cancelled", "its task was stopped"
    for r in ("c5", "c6", "c7", "c8"):
        assert (by_row[r]["status"], by_row[r]["task_id"]) == ("cancelled", None)
        assert model.book.asked(name, r) == 0
    # The results of a cancelled experiment: its two scored items, 1 and 0.
    assert results.status_code == 200, results.text
    arm = results.json()["arms"][0]
    assert (arm["n"], arm["mean"], arm["cancelled"], arm["errors"]) == (
        2,
        pytest.approx(0.5),
        6,
        {},
    )
    assert results.json()["status"] == "cancelled"
    assert model.failures == []
    assert_each_item_started_and_ended_once(config, exp_id, items, "experiment.cancelled")
    # Cancelling it again changes nothing (the released contract: 202, still cancelled,
    # no second `experiment.cancelled` — checked by the event log above).
    assert again.status_code == 202, again.text
    assert again.json()["status"] == "cancelled"
    check_consistency(config, list(tasks), private_redis.client())
