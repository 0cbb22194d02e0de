"""GET /v1/experiments: the tenant's experiments newest first, paged by an opaque cursor,
filtered by status, with every experiment's progress read in grouped queries."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import event, update

from app.api.app import create_app
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.ids import utc_now
from app.resources import open_resources
from app.services.cursors import decode_cursor, encode_cursor
from tests.api.conftest import assert_error, serve
from tests.support.experiments import as_tenant, experiment, progress


async def backdate(sessions: Sessions, ids: list[str]) -> None:
    """Creation times one minute apart, oldest first (a page boundary must not tie)."""
    start = utc_now() - timedelta(hours=1)
    async with sessions.begin() as session:
        for i, exp_id in enumerate(ids):
            await session.execute(
                update(models.Experiment)
                .where(models.Experiment.id == exp_id)
                .values(created_at=start + timedelta(minutes=i))
            )


async def test_pages_newest_first_with_progress_and_a_status_filter(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    async with serve(create_app(make_settings())) as client:
        ids = []
        for i in range(5):
            answer = await client.post("/v1/experiments", json=experiment(name=f"e{i}"))
            assert answer.status_code == 202, answer.text
            ids.append(answer.json()["id"])
        await backdate(sessions, ids)
        assert (await client.post(f"/v1/experiments/{ids[1]}/cancel")).status_code == 202

        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            query = {"limit": 2} | ({"cursor": cursor} if cursor else {})
            page = (await client.get("/v1/experiments", params=query)).json()
            assert set(page) == {"experiments", "next_cursor"}
            seen += [exp["id"] for exp in page["experiments"]]
            pages += 1
            if (cursor := page["next_cursor"]) is None:
                break
        assert seen == ids[::-1], "newest first, each once"
        assert pages == 3

        listed = (await client.get("/v1/experiments")).json()
        assert listed["next_cursor"] is None
        one = await client.get(f"/v1/experiments/{ids[4]}")
        assert listed["experiments"][0] == one.json(), "the same ExperimentOut as a read"
        assert listed["experiments"][0]["progress"]["a"]["running"] == 1
        cancelled_one = listed["experiments"][3]
        assert cancelled_one["status"] == "cancelled"
        assert cancelled_one["progress"]["a"] | cancelled_one["progress"]["b"] == progress(
            running=1, cancelled=2
        ), "its pending items cancelled, its running ones' tasks being stopped"

        cancelled = (await client.get("/v1/experiments", params={"status": "cancelled"})).json()
        assert [exp["id"] for exp in cancelled["experiments"]] == [ids[1]]
        running = (await client.get("/v1/experiments?status=running&limit=3")).json()
        assert [exp["id"] for exp in running["experiments"]] == [ids[4], ids[3], ids[2]]
        assert running["next_cursor"] is not None
        rest = await client.get(f"/v1/experiments?status=running&cursor={running['next_cursor']}")
        assert [exp["id"] for exp in rest.json()["experiments"]] == [ids[0]]
        none = await client.get("/v1/experiments?status=finished")
        assert none.json() == {"experiments": [], "next_cursor": None}


async def test_another_tenants_experiments_are_not_listed(keyed_client: httpx.AsyncClient) -> None:
    alice, bob = as_tenant("alice"), as_tenant("bob")
    mine = (await keyed_client.post("/v1/experiments", json=experiment(), headers=alice)).json()
    listed = (await keyed_client.get("/v1/experiments", headers=alice)).json()["experiments"]
    assert [exp["id"] for exp in listed] == [mine["id"]]
    theirs = await keyed_client.get("/v1/experiments", headers=bob)
    assert theirs.json() == {"experiments": [], "next_cursor": None}
    assert_error(await keyed_client.get("/v1/experiments"), 401, "unauthorized")


async def test_bad_queries_are_422s(make_settings: Callable[..., Settings]) -> None:
    async with serve(create_app(make_settings())) as client:
        for query, loc in [
            ("stauts=running", ["query", "stauts"]),
            ("status=done", ["query", "status"]),
            ("limit=0", ["query", "limit"]),
            ("limit=101", ["query", "limit"]),
            ("cursor=not-a-cursor", ["query", "cursor"]),
            ("cursor=WyJ4Il0", ["query", "cursor"]),  # an earlier release's form
            ("cursor=999999999999999999-exp_1", ["query", "cursor"]),  # past the year 8300
        ]:
            error = assert_error(await client.get(f"/v1/experiments?{query}"), 422, "invalid_input")
            assert loc in [p["loc"] for p in error["details"]], (query, error)


def test_every_string_the_cursor_pattern_admits_is_a_cursor() -> None:
    """What a client that trusts the OpenAPI document may send is read, never a 422."""
    for cursor in ("000000000000000000-a", "199999999999999999-" + "z" * 64, "1" * 18 + "-_"):
        when, row_id = decode_cursor(cursor)
        assert encode_cursor(when, row_id) == cursor
    now = datetime.now(UTC)
    assert decode_cursor(encode_cursor(now, "exp_01J")) == (now, "exp_01J")


async def test_a_page_costs_the_same_few_queries_however_many_experiments(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    async with serve(create_app(settings)) as client:
        for _ in range(6):
            assert (await client.post("/v1/experiments", json=experiment())).status_code == 202
    async with open_resources(settings) as res:
        from app.services.experiments import service as experiments

        statements: list[str] = []

        def count(*args: object) -> None:
            statements.append(str(args[2]))

        event.listen(res.engine.sync_engine, "before_cursor_execute", count)
        two = await experiments.list_experiments(res.sessions, "default", limit=2)
        small = len(statements)
        statements.clear()
        six = await experiments.list_experiments(res.sessions, "default", limit=6)
    assert (len(two.experiments), len(six.experiments)) == (2, 6)
    assert len(statements) == small <= 3, statements
