"""Query parameters a list route does not take are a 422 naming them, never silently ignored.

A misspelt filter would otherwise answer the unfiltered list as if it applied.
The routes' own parameters keep working, `?token=` stays accepted on the event
streams, and a caller without a key still gets its 401 first.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from app.api.app import create_app
from app.config import Settings
from app.db.engine import Sessions
from tests.api.conftest import assert_error, serve
from tests.support.rows import insert_task

ADMIN_KEY = "shv_admin_query_params_test"


@pytest.mark.parametrize(
    ("path", "known"),
    [
        ("/v1/tasks", {"status": "queued", "limit": "5"}),
        ("/v1/tasks/{id}/trajectory", {"attempt": "1", "format": "reference"}),
        ("/v1/tasks/{id}/artifacts", {}),
        ("/v1/tasks/{id}/events", {"after": "0"}),
    ],
)
async def test_unknown_query_parameters_are_422_naming_them(
    client: httpx.AsyncClient, sessions: Sessions, path: str, known: dict[str, str]
) -> None:
    task_id = await insert_task(sessions, status="succeeded")
    url = path.format(id=task_id)
    response = await client.get(url, params={**known, "stauts": "failed", "x": "1"})
    error = assert_error(response, 422, "invalid_input")
    assert "stauts" in error["message"]
    assert "x" in error["message"]
    assert [d["loc"] for d in error["details"]] == [["query", "stauts"], ["query", "x"]]
    assert (await client.get(url, params=known)).status_code in (200, 204)


async def test_a_misspelt_filter_no_longer_lists_everything(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    await insert_task(sessions, status="queued")
    error = assert_error(await client.get("/v1/tasks?stauts=failed"), 422, "invalid_input")
    assert error["details"] == [
        {"loc": ["query", "stauts"], "msg": "unknown query parameter", "type": "extra_forbidden"}
    ]
    listed = await client.get("/v1/tasks?status=failed")
    assert listed.json() == {"items": [], "next_cursor": None}


async def test_the_key_is_checked_first_and_token_stays_allowed_on_the_stream(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = make_settings(auth="keys", admin_api_key=ADMIN_KEY)
    task_id = await insert_task(sessions, tenant="admin", status="succeeded")
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with serve(create_app(settings)) as client:
        anonymous = await client.get("/v1/tasks?bogus=1")
        assert_error(anonymous, 401, "unauthorized")
        assert_error(await client.get("/v1/tasks?bogus=1", headers=admin), 422, "invalid_input")
        events = f"/v1/tasks/{task_id}/events"
        streamed = await client.get(events, params={"token": ADMIN_KEY}, headers=admin)
        assert streamed.status_code == 204, streamed.text  # finished, nothing after 0
        refused = await client.get(events, params={"tokn": ADMIN_KEY}, headers=admin)
        assert_error(refused, 422, "invalid_input")
