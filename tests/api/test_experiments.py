"""`/v1/experiments` without a worker: bad input is a 422 naming the row and field with
nothing stored, the first items start at once, cancel, tenant isolation, and a chore re-run
that does nothing. The end-to-end run with a worker is tests/worker/test_experiments.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select, text

from app.api.app import create_app
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.resources import open_resources
from app.services.experiments import runner as experiment_runner
from tests.api.conftest import assert_error, serve
from tests.support.experiments import as_tenant, counts, experiment, progress


def rows_with(*rows: dict[str, Any]) -> dict[str, Any]:
    return {"rows": list(rows)}


BAD: list[tuple[str, dict[str, Any], list[Any]]] = [
    (
        "row without an id",
        {"dataset": rows_with({"problem_statement": "p", "ground_truth": "1"})},
        ["body", "dataset", "rows", 0, "id"],
    ),
    (
        "row without a problem statement",
        {"dataset": rows_with({"id": "x", "ground_truth": "1"})},
        ["body", "dataset", "rows", 0, "problem_statement"],
    ),
    (
        "duplicate ids",
        {
            "dataset": rows_with(
                {"id": "x", "problem_statement": "p", "ground_truth": "1"},
                {"id": "x", "problem_statement": "q", "ground_truth": "2"},
            )
        },
        ["body", "dataset", "rows", 1, "id"],
    ),
    (
        "no ground truth for a scorer that needs one",
        {"dataset": rows_with({"id": "x", "problem_statement": "p"})},
        ["body", "dataset", "rows", 0, "ground_truth"],
    ),
    (
        "instruction_following row without its instructions",
        {
            "scorer": {"kind": "instruction_following"},
            "dataset": rows_with({"id": "x", "problem_statement": "p"}),
        },
        ["body", "dataset", "rows", 0],
    ),
    ("unknown scorer", {"scorer": {"kind": "vibes"}}, ["body", "scorer"]),
    (
        "an arm whose task does not resolve",
        {"arms": [{"name": "a", "task": {"limits": {"max_steps": 10**6}}}]},
        ["body", "arms", 0, "task", "limits", "max_steps"],
    ),
    (
        "an arm with an unknown task option",
        {"arms": [{"name": "a"}, {"name": "b", "task": {"llm": {"profile": "nope"}}}]},
        ["body", "arms", 1, "task", "llm", "profile"],
    ),
    (
        "an arm that sets the prompt",
        {"arms": [{"name": "a", "task": {"prompt": "x"}}]},
        ["body", "arms", 0, "task", "prompt"],
    ),
    (
        "a vanilla arm that asks for tools",
        {"arms": [{"name": "v", "mode": "vanilla", "task": {"tools": {"profile": "reference"}}}]},
        ["body", "arms", 0, "task", "tools"],
    ),
    (
        "an arm that sets the mode inside its task",
        {"arms": [{"name": "a", "task": {"mode": "vanilla"}}]},
        ["body", "arms", 0, "task", "mode"],
    ),
    ("a name with a NUL", {"name": "a\u0000b"}, ["body", "name"]),
    (
        "duplicate arm names",
        {"arms": [{"name": "a"}, {"name": "a"}]},
        ["body", "arms", 1, "name"],
    ),
    (
        "input files that are not path to text",
        {
            "dataset": rows_with(
                {"id": "x", "problem_statement": "p", "ground_truth": "1", "input_files": "[1]"}
            )
        },
        ["body", "dataset", "rows", 0, "input_files"],
    ),
    (
        "an input file path that escapes",
        {
            "dataset": rows_with(
                {
                    "id": "x",
                    "problem_statement": "p",
                    "ground_truth": "1",
                    "input_files": {"../x": "y"},
                }
            )
        },
        ["body", "dataset", "rows", 0, "input_files", 0, "path"],
    ),
    ("too many attempts", {"attempts": 3}, ["body", "attempts"]),
    ("too many arms", {"arms": [{"name": f"a{i}"} for i in range(3)]}, ["body", "arms"]),
    (
        "too many rows",
        {
            "dataset": rows_with(
                *[{"id": i, "problem_statement": "p", "ground_truth": 1} for i in range(5)]
            )
        },
        ["body", "dataset", "rows"],
    ),
    ("a slice from an unknown row", {"start_id": "q9"}, ["body", "start_id"]),
    ("a slice that ends before it starts", {"start_id": "q3", "end_id": "q1"}, ["body", "end_id"]),
    ("metadata too big", {"metadata": {"x": "y" * 300}}, ["body", "metadata"]),
    (
        "an arm's metadata too big",
        {"arms": [{"name": "a", "task": {"metadata": {"x": "y" * 300}}}]},
        ["body", "arms", 0, "task", "metadata"],
    ),
]


@pytest.mark.parametrize(("case", "change", "loc"), BAD, ids=[case for case, _, _ in BAD])
async def test_bad_input_is_a_422_naming_the_row_and_field_and_nothing_is_stored(
    make_settings: Callable[..., Settings],
    sessions: Sessions,
    case: str,
    change: dict[str, Any],
    loc: list[Any],
) -> None:
    settings = make_settings(
        experiment_max_attempts=2,
        experiment_max_arms=2,
        experiment_max_rows=4,
        max_metadata_bytes=256,
    )
    async with serve(create_app(settings)) as client:
        answer = await client.post("/v1/experiments", json=experiment(**change))
    error = assert_error(answer, 422, "invalid_input")
    assert loc in [problem["loc"] for problem in error["details"]], (case, error)
    if loc[:3] == ["body", "dataset", "rows"] and len(loc) > 3 and case != "row without an id":
        assert "'x'" in error["message"], "the message names the row"
    assert await counts(sessions) == (0, 0, 0)


async def test_create_starts_the_first_items_and_links_each_to_its_task(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    async with serve(create_app(make_settings())) as client:
        answer = await client.post("/v1/experiments", json=experiment(attempts=2))
        assert answer.status_code == 202, answer.text
        exp = answer.json()
        assert answer.headers["location"] == f"/v1/experiments/{exp['id']}"
        assert exp["id"].startswith("exp_")
        assert (exp["status"], exp["rows"], exp["attempts"]) == ("running", 3, 2)
        assert [arm["name"] for arm in exp["arms"]] == ["a", "b"]
        assert exp["progress"]["a"] == progress(pending=5, running=1)
        assert exp["progress"]["b"]["running"] == 1, "concurrency 2: q1 in both arms"
        items = (await client.get(f"/v1/experiments/{exp['id']}/items")).json()["items"]
        assert len(items) == 12
        first = items[0]
        assert (first["row_id"], first["arm"], first["attempt"]) == ("q1", "a", 1)
        task = (await client.get(f"/v1/tasks/{first['task_id']}")).json()
        assert task["prompt"] == "What is 1 + 1?"
        assert task["limits"]["max_steps"] == 5, "the arm's options"
        assert task["metadata"] == {"experiment": exp["id"], "row": "q1", "arm": "a", "attempt": 1}
    assert await counts(sessions) == (1, 12, 2)
    async with sessions() as session:  # each row once, not once per arm and attempt
        stored = await session.scalars(
            select(models.ExperimentRow.row_id).where(
                models.ExperimentRow.experiment_id == exp["id"]
            )
        )
        assert sorted(stored) == ["q1", "q2", "q3"]
        copies = await session.scalar(
            select(func.count()).where(
                models.ExperimentItem.experiment_id == exp["id"],
                models.ExperimentItem.own_row.is_not(None),
            )
        )
        assert copies == 0


async def test_items_an_earlier_release_wrote_with_their_own_rows_still_start_and_report(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    """Before `experiment_rows`, each item carried a copy of its row: such an experiment,
    running when the upgrade lands, starts its next items with their prompts and reports
    its rows' domains from those copies."""
    settings = make_settings()
    body = experiment(arms=[{"name": "a"}], concurrency=1)
    for row in body["dataset"]["rows"]:
        row["domain"] = f"domain of {row['id']}"
    async with serve(create_app(settings)) as client:
        exp = (await client.post("/v1/experiments", json=body)).json()
        async with sessions.begin() as session:  # as the earlier release stored it
            await session.execute(
                text(
                    "UPDATE experiment_items AS i SET row = r.row FROM experiment_rows AS r "
                    "WHERE r.experiment_id = i.experiment_id AND r.row_id = i.row_id "
                    "AND i.experiment_id = :id"
                ),
                {"id": exp["id"]},
            )
            await session.execute(
                text("DELETE FROM experiment_rows WHERE experiment_id = :id"), {"id": exp["id"]}
            )
            await session.execute(
                text(
                    "UPDATE experiments SET spec = jsonb_set(spec, '{concurrency}', '3') "
                    "WHERE id = :id"
                ),
                {"id": exp["id"]},
            )
        async with open_resources(settings) as res:
            await experiment_runner.advance_all(res.sessions, res.redis, settings)
        items = (await client.get(f"/v1/experiments/{exp['id']}/items")).json()["items"]
        prompts = [
            (await client.get(f"/v1/tasks/{item['task_id']}")).json()["prompt"] for item in items
        ]
        assert prompts == [f"What is {i} + {i}?" for i in (1, 2, 3)]
        async with sessions.begin() as session:
            await session.execute(
                text(
                    "UPDATE experiment_items SET status = 'scored', score = 1 "
                    "WHERE experiment_id = :id"
                ),
                {"id": exp["id"]},
            )
        results = (await client.get(f"/v1/experiments/{exp['id']}/results")).json()
    assert sorted(results["arms"][0]["domains"]) == ["domain of q1", "domain of q2", "domain of q3"]


async def test_a_row_slice_and_input_files_as_a_json_string(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    body = experiment(arms=[{"name": "a"}], start_id="q2", end_id="q3", concurrency=1)
    body["dataset"]["rows"][1]["input_files"] = '{"data.csv": "x,y\\n1,2\\n"}'
    async with serve(create_app(make_settings())) as client:
        exp = (await client.post("/v1/experiments", json=body)).json()
        items = (await client.get(f"/v1/experiments/{exp['id']}/items")).json()["items"]
    assert [item["row_id"] for item in items] == ["q2", "q3"]
    async with sessions() as session:
        blob = await session.scalar(
            select(models.InputBlob).where(models.InputBlob.task_id == items[0]["task_id"])
        )
    assert blob is not None
    assert (blob.path, blob.content) == ("data.csv", b"x,y\n1,2\n")


async def test_re_running_the_chore_starts_and_scores_nothing_twice(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = make_settings()
    async with serve(create_app(settings)) as client:
        exp = (await client.post("/v1/experiments", json=experiment())).json()
    async with open_resources(settings) as res:
        for _ in range(3):  # nothing ended, concurrency reached: nothing to do
            assert await experiment_runner.advance_all(res.sessions, res.redis, settings) == 0
    assert await counts(sessions) == (1, 6, 2)
    async with sessions() as session:
        linked = list(
            await session.scalars(
                select(models.ExperimentItem.task_id).where(
                    models.ExperimentItem.experiment_id == exp["id"],
                    models.ExperimentItem.task_id.is_not(None),
                )
            )
        )
    assert len(linked) == len(set(linked)) == 2


async def test_cancel_ends_queued_items_and_refuses_a_second_finish(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    async with serve(create_app(settings)) as client:
        exp = (await client.post("/v1/experiments", json=experiment())).json()
        url = f"/v1/experiments/{exp['id']}"
        cancelled = await client.post(f"{url}/cancel")
        assert cancelled.status_code == 202, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        async with open_resources(settings) as res:
            await experiment_runner.advance_all(res.sessions, res.redis, settings)
        after = (await client.get(url)).json()
        assert {arm: p["cancelled"] for arm, p in after["progress"].items()} == {"a": 3, "b": 3}
        items = (await client.get(f"{url}/items")).json()["items"]
        started = [item["task_id"] for item in items if item["task_id"]]
        assert len(started) == 2
        for task_id in started:
            assert (await client.get(f"/v1/tasks/{task_id}")).json()["status"] == "cancelled"
        results = (await client.get(f"{url}/results")).json()
        assert [(arm["n"], arm["cancelled"]) for arm in results["arms"]] == [(0, 3), (0, 3)]
        assert results["pairs"] == []
        assert (await client.post(f"{url}/cancel")).status_code == 202, "cancelled again: same"


async def test_another_tenants_experiment_is_not_found(keyed_client: httpx.AsyncClient) -> None:
    alice, bob = as_tenant("alice"), as_tenant("bob")
    created = await keyed_client.post("/v1/experiments", json=experiment(), headers=alice)
    url = f"/v1/experiments/{created.json()['id']}"
    assert (await keyed_client.get(url, headers=alice)).status_code == 200
    for path in ("", "/results", "/items", "/items?format=csv"):
        assert_error(await keyed_client.get(url + path, headers=bob), 404, "not_found")
    assert_error(await keyed_client.post(f"{url}/cancel", headers=bob), 404, "not_found")
    assert (await keyed_client.get(url, headers=alice)).json()["status"] == "running"
    assert_error(await keyed_client.get(url), 401, "unauthorized")


async def test_items_refused_by_backpressure_wait_and_start_later(
    make_settings: Callable[..., Settings],
) -> None:
    tight = make_settings(tenant_max_active_tasks=1)
    async with serve(create_app(tight)) as client:
        exp = (await client.post("/v1/experiments", json=experiment())).json()
        assert exp["progress"]["a"]["running"] + exp["progress"]["b"]["running"] == 1
        roomy = tight.model_copy(update={"tenant_max_active_tasks": 100})
        async with open_resources(roomy) as res:
            assert await experiment_runner.advance_all(res.sessions, res.redis, roomy) == 1
        after = (await client.get(f"/v1/experiments/{exp['id']}")).json()
        assert [p["running"] for p in after["progress"].values()] == [1, 1]
        assert sum(p["pending"] for p in after["progress"].values()) == 4


async def fail_task(sessions: Sessions, task_id: str, reason: str = "llm_error") -> None:
    """The task ends as if the service had failed it (no worker needed)."""
    async with sessions.begin() as session:
        await session.execute(
            text(
                "UPDATE tasks SET status = 'failed', finish_reason = :reason, "
                "error = 'the model server refused', usage = '{\"steps\": 2}', "
                "finished_at = now() WHERE id = :id"
            ),
            {"id": task_id, "reason": reason},
        )


async def test_an_item_the_service_failed_waits_out_its_backoff_then_runs_again(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = make_settings(experiment_retry_backoff_s=3600)
    body = experiment(arms=[{"name": "a"}], concurrency=1, infrastructure_retries=1)
    async with serve(create_app(settings)) as client:
        exp = (await client.post("/v1/experiments", json=body)).json()
        url = f"/v1/experiments/{exp['id']}"
        (first,) = [i for i in (await client.get(f"{url}/items")).json()["items"] if i["task_id"]]
        await fail_task(sessions, first["task_id"])
        async with open_resources(settings) as res:
            await experiment_runner.advance_all(res.sessions, res.redis, settings)
            items = (await client.get(f"{url}/items")).json()["items"]
            waiting = next(i for i in items if i["row_id"] == first["row_id"])
            assert (waiting["status"], waiting["task_id"], waiting["retries"]) == (
                "pending",
                None,
                1,
            )
            assert (waiting["steps"], waiting["answer"]) == (0, None), "the failed run is not its"
            assert [i["task_id"] is not None for i in items] == [False, True, False], (
                "concurrency 1: the next row took the slot; q1 waits out its hour"
            )
            async with sessions.begin() as session:  # an hour later, on Postgres's clock
                await session.execute(
                    text(
                        "UPDATE experiment_items SET updated_at = now() - interval '2 hours' "
                        "WHERE experiment_id = :id AND row_id = 'q1'"
                    ),
                    {"id": exp["id"]},
                )
            second = next(i for i in items if i["task_id"])
            await fail_task(sessions, second["task_id"], reason="max_steps")  # the agent's
            await experiment_runner.advance_all(res.sessions, res.redis, settings)
        items = {i["row_id"]: i for i in (await client.get(f"{url}/items")).json()["items"]}
    async with sessions() as session:  # the log the stream replays (it follows a running one)
        retried = list(
            await session.scalars(
                select(models.ExperimentEvent.data).where(
                    models.ExperimentEvent.experiment_id == exp["id"],
                    models.ExperimentEvent.type == "item.retried",
                )
            )
        )
    assert items["q1"]["status"] == "running"
    assert items["q1"]["task_id"] not in (None, first["task_id"])
    assert (items["q2"]["status"], items["q2"]["error_kind"], items["q2"]["retries"]) == (
        "error",
        "agent",
        0,
    ), "only the service's failures are retried"
    (data,) = retried
    assert (data["row_id"], data["task_id"], data["reason"], data["retries"]) == (
        "q1",
        first["task_id"],
        "llm_error",
        1,
    )
    assert data["usage"]["steps"] == 2, "what the failed run cost is in the log"


async def test_a_cancelled_experiment_ends_an_item_the_service_failed_instead_of_retrying(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    """Its task failed as the cancel reached it: nothing starts any more, so the item ends."""
    settings = make_settings(experiment_retry_backoff_s=0)
    body = experiment(arms=[{"name": "a"}], concurrency=1, infrastructure_retries=3)
    async with serve(create_app(settings)) as client:
        exp = (await client.post("/v1/experiments", json=body)).json()
        url = f"/v1/experiments/{exp['id']}"
        (running,) = [i for i in (await client.get(f"{url}/items")).json()["items"] if i["task_id"]]
        await fail_task(sessions, running["task_id"])  # ends failed before the cancel lands
        assert (await client.post(f"{url}/cancel")).status_code == 202
        async with open_resources(settings) as res:
            await experiment_runner.advance_all(res.sessions, res.redis, settings)
        items = {i["row_id"]: i for i in (await client.get(f"{url}/items")).json()["items"]}
    ended = items[running["row_id"]]
    assert (ended["status"], ended["error_kind"], ended["retries"]) == (
        "error",
        "infrastructure",
        0,
    )
    assert ended["detail"]["reason"] == "llm_error"
    assert {i["status"] for i in items.values()} == {"error", "cancelled"}


async def test_under_the_package_rules_an_agent_out_of_steps_is_scored_on_its_answer(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    """A built-in scorer (scored before the advancing transaction): a sandbox task that ran
    out of steps after writing `  4` is scored on "4", as the package reads answer.txt;
    one that wrote nothing is scored on the empty text."""
    settings = make_settings()
    rows = [{"id": f"q{i}", "problem_statement": "2 + 2?", "ground_truth": "4"} for i in (1, 2)]
    body = {
        "name": "package rules",
        "dataset": {"rows": rows},
        "arms": [{"name": "s"}],
        "scorer": {"kind": "exact", "case_sensitive": True},
        "concurrency": 2,
        "rules": "package",
    }
    async with serve(create_app(settings)) as client:
        exp = (await client.post("/v1/experiments", json=body)).json()
        url = f"/v1/experiments/{exp['id']}"
        items = {i["row_id"]: i for i in (await client.get(f"{url}/items")).json()["items"]}
        async with sessions.begin() as session:
            for row_id, answer in (("q1", "  4\n"), ("q2", None)):
                await session.execute(
                    text(
                        "UPDATE tasks SET status = 'failed', finish_reason = 'max_steps', "
                        "answer = :answer, finished_at = now() WHERE id = :id"
                    ),
                    {"id": items[row_id]["task_id"], "answer": answer},
                )
        async with open_resources(settings) as res:
            await experiment_runner.advance_all(res.sessions, res.redis, settings)
        items = {i["row_id"]: i for i in (await client.get(f"{url}/items")).json()["items"]}
        done = (await client.get(url)).json()
    assert (items["q1"]["status"], items["q1"]["score"], items["q1"]["answer"]) == (
        "scored",
        1.0,
        "4",
    )
    assert (items["q2"]["status"], items["q2"]["score"], items["q2"]["answer"]) == (
        "scored",
        0.0,
        "",
    )
    assert (done["status"], done["rules"]) == ("finished", "package")
