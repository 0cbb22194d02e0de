"""`POST /v1/experiments/{id}/regrade` and the scorer checks without a worker: 409 while the
experiment runs, 422 for a scorer creation would refuse (an `llm_judge` profile that does
not exist, listing those that do) with nothing changed, what a regrade archives and
queues, `results?grading=N`, and the experiment figures on `/metrics`.

The scoring itself (a worker's loop) is tests/worker/test_experiment_regrade.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from sqlalchemy import select, update

from app.api.app import create_app
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from tests.api.conftest import assert_error, serve
from tests.support.experiments import as_tenant, counts, experiment

Item = models.ExperimentItem
EVENTS = models.ExperimentEvent


async def ended(sessions: Sessions, exp_id: str) -> None:
    """As if every item had run and been scored: q1 right, the others wrong."""
    async with sessions.begin() as session:
        await session.execute(
            update(Item)
            .where(Item.experiment_id == exp_id)
            .values(status="scored", score=0.0, answer="\\boxed{3}", detail={"extracted": "3"})
        )
        await session.execute(
            update(Item).where(Item.experiment_id == exp_id, Item.row_id == "q1").values(score=1.0)
        )
        await session.execute(
            update(models.Experiment)
            .where(models.Experiment.id == exp_id)
            .values(status="finished")
        )


async def snapshot(sessions: Sessions, exp_id: str) -> tuple[Any, ...]:
    async with sessions() as session:
        exp = await session.get(models.Experiment, exp_id)
        assert exp is not None
        items = await session.execute(
            select(Item.status, Item.score, Item.gradings).where(Item.experiment_id == exp_id)
        )
        events = await session.scalars(select(EVENTS.type).where(EVENTS.experiment_id == exp_id))
        return exp.status, exp.spec, sorted(map(tuple, items), key=str), list(events)


async def test_an_llm_judge_with_an_unknown_profile_is_refused_naming_the_profiles(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    async with serve(create_app(make_settings())) as client:
        scorer = {"kind": "llm_judge", "profile": "nope"}
        answer = await client.post("/v1/experiments", json=experiment(scorer=scorer))
        error = assert_error(answer, 422, "invalid_input")
        (found,) = [d for d in error["details"] if d["loc"][:2] == ["body", "scorer"]]
        assert found["loc"] == ["body", "scorer", "profile"]
        assert found["type"] == "unknown_profile"
        assert found["available"] == ["default"]
        assert "available: default" in found["msg"]
        no_profile = await client.post(
            "/v1/experiments", json=experiment(scorer={"kind": "llm_judge", "repeats": 3})
        )
        assert "needs a 'profile'" in assert_error(no_profile, 422, "invalid_input")["message"]
        fine = await client.post(
            "/v1/experiments",
            json=experiment(scorer={"kind": "llm_judge", "profile": "default", "repeats": 3}),
        )
        assert fine.status_code == 202, fine.text
        assert fine.json()["scorer"]["repeats"] == 3
    assert (await counts(sessions))[0] == 1, "only the good one was stored"


async def test_regrade_is_409_while_running_422_for_a_bad_scorer_then_archives_and_queues(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    async with serve(create_app(make_settings())) as client:
        exp = (await client.post("/v1/experiments", json=experiment())).json()
        url = f"/v1/experiments/{exp['id']}"
        running = await client.post(f"{url}/regrade", json={"scorer": {"kind": "exact"}})
        assert "still running" in assert_error(running, 409, "conflict")["message"]

        await ended(sessions, exp["id"])
        before = await snapshot(sessions, exp["id"])
        for scorer, where in [
            ({"kind": "nope"}, ["body", "scorer"]),
            ({"kind": "math", "tolerance": "big"}, ["body", "scorer"]),
            ({"kind": "llm_judge", "profile": "nope"}, ["body", "scorer", "profile"]),
        ]:
            bad = await client.post(f"{url}/regrade", json={"scorer": scorer})
            error = assert_error(bad, 422, "invalid_input")
            assert [d["loc"] for d in error["details"]] == [where], error
        missing = await client.post(f"{url}/regrade", json={})
        assert_error(missing, 422, "invalid_input")
        assert await snapshot(sessions, exp["id"]) == before, "nothing changed"

        answer = await client.post(f"{url}/regrade", json={"scorer": {"kind": "exact"}})
        assert answer.status_code == 202, answer.text
        regraded = answer.json()
        assert (regraded["status"], regraded["grading"]) == ("running", 2)
        assert regraded["scorer"] == {"kind": "exact"}
        assert regraded["progress"]["a"]["scoring"] == 3
        assert regraded["progress"]["a"]["scored"] == 0
        again = await client.post(f"{url}/regrade", json={"scorer": {"kind": "math"}})
        assert_error(again, 409, "conflict")

        items = (await client.get(f"{url}/items")).json()["items"]
        assert {i["status"] for i in items} == {"scoring"}
        first = items[0]
        assert (first["score"], first["detail"]) == (None, {})
        assert first["gradings"] == [
            {
                "grading": 1,
                "scorer": {"kind": "math"},
                "status": "scored",
                "score": 1.0,
                "error_kind": None,
                "detail": {"extracted": "3"},
            }
        ]
        table = (await client.get(f"{url}/items", params={"format": "csv"})).text
        assert "gradings" not in table.splitlines()[0]

        original = (await client.get(f"{url}/results", params={"grading": 1})).json()
        assert original["grading"] == 1
        assert [(a["n"], a["mean"]) for a in original["arms"]] == [(3, 1 / 3), (3, 1 / 3)]
        now = (await client.get(f"{url}/results")).json()
        assert (now["grading"], now["arms"][0]["n"]) == (2, 0), "nothing scored yet"
        for grading in (3, 0):
            bad = await client.get(f"{url}/results", params={"grading": grading})
            assert bad.status_code == 422, bad.text

    async with sessions() as session:
        stored = await session.get(models.Experiment, exp["id"])
        assert stored is not None
        assert stored.spec["earlier_scorers"] == [{"kind": "math"}]
        assert stored.spec["regrade_ends"] == "finished"
        types = list(
            await session.scalars(select(EVENTS.type).where(EVENTS.experiment_id == exp["id"]))
        )
    assert types[-1] == "experiment.regrading"


async def test_another_tenants_experiment_cannot_be_regraded(
    keyed_client: httpx.AsyncClient, sessions: Sessions
) -> None:
    alice, bob = as_tenant("alice"), as_tenant("bob")
    exp = (await keyed_client.post("/v1/experiments", json=experiment(), headers=alice)).json()
    await ended(sessions, exp["id"])
    url = f"/v1/experiments/{exp['id']}/regrade"
    answer = await keyed_client.post(url, json={"scorer": {"kind": "exact"}}, headers=bob)
    assert_error(answer, 404, "not_found")
    mine = await keyed_client.post(url, json={"scorer": {"kind": "exact"}}, headers=alice)
    assert mine.status_code == 202


async def test_metrics_count_experiments_and_items_by_status(
    make_settings: Callable[..., Settings],
) -> None:
    async with serve(create_app(make_settings())) as client:
        exp = (await client.post("/v1/experiments", json=experiment())).json()
        await client.post(f"/v1/experiments/{exp['id']}/cancel")
        await client.post("/v1/experiments", json=experiment())
        text = (await client.get("/metrics")).text
    assert 'sandhive_experiments{status="running"} 1.0' in text
    assert 'sandhive_experiments{status="cancelled"} 1.0' in text
    assert 'sandhive_experiments{status="finished"} 0.0' in text
    assert 'sandhive_experiment_items{status="pending"} 4.0' in text, "2 of 6 run in each"
    assert 'sandhive_experiment_items{status="running"} 4.0' in text
    assert 'sandhive_experiment_items{status="cancelled"} 4.0' in text
    assert 'sandhive_experiment_items{status="scoring"} 0.0' in text


async def test_cancel_records_its_items_and_the_experiment_cancelled_once(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    async with serve(create_app(make_settings())) as client:
        exp = (await client.post("/v1/experiments", json=experiment())).json()
        url = f"/v1/experiments/{exp['id']}"
        assert (await client.post(f"{url}/cancel")).status_code == 202
        assert (await client.post(f"{url}/cancel")).status_code == 202
    async with sessions() as session:
        query = select(EVENTS).where(EVENTS.experiment_id == exp["id"]).order_by(EVENTS.seq)
        log = list(await session.scalars(query))
    assert [e.seq for e in log] == list(range(1, 8))
    assert [e.type for e in log] == ["item.started"] * 2 + ["item.ended"] * 4 + [
        "experiment.cancelled"
    ], "a second cancel changes nothing and reports nothing"
    started = [e.data for e in log[:2]]
    assert [(d["row_id"], d["arm"], d["attempt"]) for d in started] == [
        ("q1", "a", 1),
        ("q1", "b", 1),
    ]
    assert all(d["task_id"].startswith("tsk_") for d in started)
    assert log[2].data == {
        "row_id": "q2",
        "arm": "a",
        "attempt": 1,
        "status": "cancelled",
        "score": None,
        "error_kind": None,
        "task_id": None,
    }


async def test_a_regrade_checks_the_rows_for_the_new_scorer_as_creation_does(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    body = experiment(scorer={"kind": "regex", "pattern": "[0-9]+"})
    del body["dataset"]["rows"][1]["ground_truth"]  # q2: fine for the scorer it was made with
    async with serve(create_app(make_settings())) as client:
        exp = (await client.post("/v1/experiments", json=body)).json()
        url = f"/v1/experiments/{exp['id']}"
        await ended(sessions, exp["id"])
        before = await snapshot(sessions, exp["id"])
        bad = await client.post(f"{url}/regrade", json={"scorer": {"kind": "exact"}})
        error = assert_error(bad, 422, "invalid_input")
        assert "row 'q2': scorer 'exact' needs a ground_truth" in error["message"]
        assert [d["loc"][-1] for d in error["details"]] == ["ground_truth"], error
        assert await snapshot(sessions, exp["id"]) == before, "nothing changed"
        pattern = {"kind": "regex", "pattern": "3"}  # needs no ground_truth
        fine = await client.post(f"{url}/regrade", json={"scorer": pattern})
        assert fine.status_code == 202, fine.text


async def test_cancelling_while_a_regrade_is_under_way_is_409_and_changes_nothing(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    async with serve(create_app(make_settings())) as client:
        exp = (await client.post("/v1/experiments", json=experiment())).json()
        url = f"/v1/experiments/{exp['id']}"
        await ended(sessions, exp["id"])
        regrading = await client.post(f"{url}/regrade", json={"scorer": {"kind": "exact"}})
        assert regrading.json()["status"] == "running"
        before = await snapshot(sessions, exp["id"])
        cancelled = await client.post(f"{url}/cancel")
        message = assert_error(cancelled, 409, "conflict")["message"]
        assert message == f"experiment {exp['id']} is being regraded; wait for it to end"
        assert await snapshot(sessions, exp["id"]) == before, "nothing changed"


async def test_a_regrade_scores_answers_the_infrastructure_never_could(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    """An answer whose scoring failed every try (Docker gone) was never judged: a regrade
    queues it as it does the scored ones; an item whose task failed stays as it is."""
    async with serve(create_app(make_settings())) as client:
        exp = (await client.post("/v1/experiments", json=experiment())).json()
        url = f"/v1/experiments/{exp['id']}"
        await ended(sessions, exp["id"])
        unscored = {"message": "scoring failed 3 times", "claims": 3, "stage": "scoring"}
        async with sessions.begin() as session:
            await session.execute(
                update(Item)
                .where(Item.experiment_id == exp["id"], Item.row_id == "q2")
                .values(status="error", score=None, error_kind="infrastructure", detail=unscored)
            )
            await session.execute(
                update(Item)
                .where(Item.experiment_id == exp["id"], Item.row_id == "q3")
                .values(status="error", score=None, error_kind="infrastructure", answer=None)
            )
        answer = await client.post(f"{url}/regrade", json={"scorer": {"kind": "exact"}})
        assert answer.status_code == 202, answer.text
        items = (await client.get(f"{url}/items")).json()["items"]
    by_row = {(i["row_id"], i["status"]) for i in items}
    assert by_row == {("q1", "scoring"), ("q2", "scoring"), ("q3", "error")}
