"""GET /v1/tasks filters: q, status, model, metadata.KEY, created_after/before; with the cursor.

Rows are written straight to Postgres (prompt, spec, metadata, created_at as wanted), and
every query goes through the real app, so a filter that is ignored or misapplied shows as
the wrong ids.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest

from app.db.engine import Sessions
from app.ids import utc_now
from tests.api.conftest import assert_error
from tests.support.experiments import insert_one_item_experiment
from tests.support.rows import SPEC, insert_task

START = utc_now() - timedelta(days=1)


def spec_with_model(model: str) -> dict[str, Any]:
    spec = SPEC.model_dump(mode="json")
    spec["llm"]["model"] = model
    return spec


async def add(sessions: Sessions, minute: int, **fields: Any) -> str:
    """A task created `minute` minutes after START (so the list order is known)."""
    model = fields.pop("model", "m")
    return await insert_task(
        sessions,
        created_at=START + timedelta(minutes=minute),
        spec=spec_with_model(model),
        **fields,
    )


async def ids(client: httpx.AsyncClient, params: Any) -> list[str]:
    response = await client.get("/v1/tasks", params=params)
    assert response.status_code == 200, response.text
    return [item["id"] for item in response.json()["items"]]


@pytest.fixture
async def corpus(sessions: Sessions) -> dict[str, str]:
    """Six tasks of this tenant, and look-alikes of another tenant that must never match."""
    made = {
        "catalan": await add(
            sessions, 1, prompt="Compute the 10th Catalan number", meta={"team": "math", "n": 10}
        ),
        "primes": await add(
            sessions,
            2,
            prompt="List PRIMES below 100",
            meta={"team": "math", "n": 100},
            model="tour",
            status="succeeded",
            finish_reason="submitted",
        ),
        "poem": await add(
            sessions,
            3,
            prompt="Write a poem on xzy and 100 cats",
            meta={"team": "words"},
            model="tour",
        ),
        "percent": await add(sessions, 4, prompt="Is 100% of x_y fine?", meta={"flag": True}),
        "failed": await add(
            sessions,
            5,
            prompt="catalan again, failing",
            meta={"team": "math", "kind": "retry"},
            status="failed",
            finish_reason="llm_error",
        ),
        "null": await add(sessions, 6, prompt="nothing", meta={"note": None, "n": "10"}),
    }
    for minute in (1, 2, 3):
        await add(
            sessions,
            minute,
            tenant="other",
            prompt="Compute the 10th Catalan number",
            meta={"team": "math", "n": 10},
            model="tour",
            status="succeeded",
        )
    return made


def newest_first(corpus: dict[str, str], *names: str) -> list[str]:
    order = ["null", "failed", "percent", "poem", "primes", "catalan"]
    return [corpus[name] for name in order if name in names]


async def test_q_is_a_case_insensitive_substring_of_the_prompt(
    client: httpx.AsyncClient, corpus: dict[str, str]
) -> None:
    assert await ids(client, {"q": "CATALAN"}) == newest_first(corpus, "catalan", "failed")
    assert await ids(client, {"q": "primes below"}) == newest_first(corpus, "primes")
    assert await ids(client, {"q": "no such words"}) == []


async def test_q_treats_like_wildcards_as_text(
    client: httpx.AsyncClient, corpus: dict[str, str]
) -> None:
    assert await ids(client, {"q": "100%"}) == newest_first(corpus, "percent")
    assert await ids(client, {"q": "x_y"}) == newest_first(corpus, "percent")
    assert await ids(client, {"q": "%"}) == newest_first(corpus, "percent")
    assert await ids(client, {"q": "0%"}) == newest_first(corpus, "percent")  # not "100 cats"
    # every id holds "_" (tsk_...), so "_" alone would match all: x_y must not match "xzy"
    assert len(await ids(client, {"q": "_"})) == len(corpus)


async def test_q_finds_a_task_by_its_id_or_part_of_it(
    client: httpx.AsyncClient, corpus: dict[str, str]
) -> None:
    poem = corpus["poem"]
    assert await ids(client, {"q": poem}) == [poem]
    assert await ids(client, {"q": poem[-8:].upper()}) == [poem]


async def test_status_and_model_filters(client: httpx.AsyncClient, corpus: dict[str, str]) -> None:
    assert await ids(client, {"status": "failed"}) == newest_first(corpus, "failed")
    assert await ids(client, {"model": "tour"}) == newest_first(corpus, "primes", "poem")
    assert await ids(client, {"model": "tou"}) == []  # exact, not a prefix
    assert await ids(client, {"model": "tour", "status": "succeeded"}) == [corpus["primes"]]


async def test_metadata_filters_match_strings_and_the_scalars_they_spell(
    client: httpx.AsyncClient, corpus: dict[str, str]
) -> None:
    math = newest_first(corpus, "catalan", "primes", "failed")
    assert await ids(client, {"metadata.team": "math"}) == math
    # 10 is stored as a number in one task and as the string "10" in another: both match
    assert await ids(client, {"metadata.n": "10"}) == newest_first(corpus, "catalan", "null")
    assert await ids(client, {"metadata.flag": "true"}) == [corpus["percent"]]
    assert await ids(client, {"metadata.note": "null"}) == [corpus["null"]]
    assert await ids(client, {"metadata.team": "Math"}) == []
    assert await ids(client, {"metadata.missing": "math"}) == []


async def test_several_metadata_filters_and_other_filters_all_apply(
    client: httpx.AsyncClient, corpus: dict[str, str]
) -> None:
    params = [("metadata.team", "math"), ("metadata.n", "100")]
    assert await ids(client, params) == [corpus["primes"]]
    params = [("metadata.team", "math"), ("q", "catalan"), ("status", "queued")]
    assert await ids(client, params) == [corpus["catalan"]]
    both = [("metadata.team", "math"), ("metadata.team", "words")]
    assert await ids(client, both) == []


async def test_in_experiment_keeps_or_drops_the_tasks_of_experiments_items(
    client: httpx.AsyncClient, sessions: Sessions, corpus: dict[str, str]
) -> None:
    """Linked by an experiment item (not by metadata, which any task may carry)."""
    spec = {"arms": [], "scorer": {"kind": "exact"}, "attempts": 1, "concurrency": 1}
    exp_id = await insert_one_item_experiment(
        sessions, spec, status="running", task_id=corpus["primes"]
    )
    assert exp_id
    everything = newest_first(corpus, *corpus)
    assert await ids(client, {}) == everything
    assert await ids(client, {"in_experiment": "true"}) == [corpus["primes"]]
    assert await ids(client, {"in_experiment": "false"}) == [
        task for task in everything if task != corpus["primes"]
    ]
    listed = await ids(client, {"in_experiment": "false", "metadata.team": "math"})
    assert listed == newest_first(corpus, "failed", "catalan")
    error = assert_error(
        await client.get("/v1/tasks", params={"in_experiment": "maybe"}), 422, "invalid_input"
    )
    assert error["details"][0]["loc"] == ["query", "in_experiment"]


async def test_created_after_is_inclusive_and_created_before_exclusive(
    client: httpx.AsyncClient, corpus: dict[str, str]
) -> None:
    at = (START + timedelta(minutes=3)).isoformat()
    assert await ids(client, {"created_after": at}) == newest_first(
        corpus, "poem", "percent", "failed", "null"
    )
    assert await ids(client, {"created_before": at}) == newest_first(corpus, "catalan", "primes")
    window = {
        "created_after": (START + timedelta(minutes=2)).isoformat(),
        "created_before": (START + timedelta(minutes=4)).isoformat(),
    }
    assert await ids(client, window) == newest_first(corpus, "primes", "poem")
    zulu = (START + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert await ids(client, {"created_after": zulu}) == newest_first(corpus, "failed", "null")
    tomorrow = (START + timedelta(days=2)).date().isoformat()  # a date alone: its midnight UTC
    assert await ids(client, {"created_after": tomorrow}) == []
    assert len(await ids(client, {"created_before": tomorrow})) == len(corpus)
    naive_utc = (START + timedelta(minutes=5)).replace(tzinfo=None).isoformat()
    assert await ids(client, {"created_after": naive_utc}) == newest_first(corpus, "failed", "null")


async def test_another_tenants_tasks_never_match(
    client: httpx.AsyncClient, corpus: dict[str, str]
) -> None:
    mine = set(corpus.values())
    for params in (
        {"q": "catalan"},
        {"model": "tour"},
        {"metadata.team": "math"},
        {"status": "succeeded"},
        {"created_before": (START + timedelta(minutes=4)).isoformat()},
    ):
        assert set(await ids(client, params)) <= mine, params


async def test_cursor_pages_through_a_filtered_list(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    wanted = [
        await add(sessions, i, prompt=f"needle {i}", meta={"batch": "b1"}) for i in range(0, 14, 2)
    ]
    for i in range(1, 14, 2):  # interleaved tasks that match neither filter
        await add(sessions, i, prompt=f"hay {i}", meta={"batch": "b2"})
    for params in ({"q": "needle"}, {"metadata.batch": "b1"}):
        seen: list[str] = []
        cursor: str | None = None
        sizes: list[int] = []
        while True:
            page_params = {**params, "limit": 3, **({"cursor": cursor} if cursor else {})}
            page = (await client.get("/v1/tasks", params=page_params)).json()
            sizes.append(len(page["items"]))
            seen += [item["id"] for item in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert sizes == [3, 3, 1], params
        assert seen == list(reversed(wanted)), params


async def test_the_list_items_carry_what_the_page_shows(
    client: httpx.AsyncClient, corpus: dict[str, str]
) -> None:
    item = (await client.get("/v1/tasks", params={"q": "primes"})).json()["items"][0]
    assert item["status"] == "succeeded"
    assert item["llm"]["model"] == "tour"
    assert "steps" in item["usage"]
    assert {"created_at", "started_at", "finished_at", "id"} <= set(item)


@pytest.mark.parametrize(
    ("params", "loc"),
    [
        ({"created_after": "yesterday"}, ["query", "created_after"]),
        ({"created_after": "0.5"}, ["query", "created_after"]),  # not a Unix time either
        ({"created_before": "1733000000"}, ["query", "created_before"]),
        ({"created_before": "2026-13-01T00:00:00Z"}, ["query", "created_before"]),
        ({"q": ""}, ["query", "q"]),
        ({"q": "x" * 201}, ["query", "q"]),
        ({"model": ""}, ["query", "model"]),
        ({"metadata.": "x"}, ["query", "metadata."]),
        ({"metadata.k": "v" * 501}, ["query", "metadata.k"]),
        ({f"metadata.k{i}": "v" for i in range(11)}, ["query", "metadata"]),
        ({"status": "nope"}, ["query", "status"]),
    ],
)
async def test_bad_filters_are_422_naming_the_parameter(
    client: httpx.AsyncClient, params: dict[str, str], loc: list[str]
) -> None:
    error = assert_error(await client.get("/v1/tasks", params=params), 422, "invalid_input")
    assert error["details"][0]["loc"] == loc
    assert loc[1] in error["message"]


async def test_unknown_parameters_are_still_refused_but_metadata_is_a_family(
    client: httpx.AsyncClient,
) -> None:
    error = assert_error(
        await client.get("/v1/tasks", params={"metadat.team": "x", "querry": "y"}),
        422,
        "invalid_input",
    )
    assert [d["loc"] for d in error["details"]] == [["query", "metadat.team"], ["query", "querry"]]
    assert (await client.get("/v1/tasks", params={"metadata.anything": "x"})).status_code == 200


async def test_limits_publishes_the_submission_limits_of_the_settings(
    client: httpx.AsyncClient, api_settings: Any
) -> None:
    response = await client.get("/v1/limits")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["max_input_file_bytes"] == api_settings.max_input_file_bytes
    assert body["max_input_total_bytes"] == api_settings.max_input_total_bytes
    assert body["max_input_files"] == api_settings.max_input_files
    assert body["max_prompt_chars"] == api_settings.max_prompt_chars
    assert body["max_multipart_body_bytes"] == api_settings.max_multipart_body_bytes
