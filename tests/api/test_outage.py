"""What the API answers while Redis is unreachable, and which driver errors stay a 500.

Of the API's calls only `/metrics` cannot answer without Redis (worker
heartbeats, the queue stream's length): it answers 503 `redis_unavailable` with
Retry-After. The rest carries on by design: a submission is stored (the workers'
reconciliation enqueues it later), a cancel is recorded in Postgres, the rate
limiter and the stream cap fail open. A driver error that is no outage (bad SQL,
an OSError of our own) stays a 500 `internal`. Postgres outages are
tests/e2e/test_faults_postgres.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from app.api.app import create_app
from app.api.deps import Res
from app.config import Settings
from tests.api.conftest import assert_error, serve
from tests.support.private_redis import PrivateRedis, running_redis

RETRY_AFTER_S = 9


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of this test's own: it is killed mid-test."""
    with running_redis(tmp_path) as server:
        yield server


def assert_redis_unavailable(response: httpx.Response) -> None:
    assert_error(response, 503, "redis_unavailable")
    assert response.headers["retry-after"] == str(RETRY_AFTER_S)


async def carries_on_without_redis(client: httpx.AsyncClient) -> None:
    """Submit, read, cancel and replay: none of them needs Redis to answer."""
    assert (await client.get("/v1/tasks")).status_code == 200
    posted = await client.post("/v1/tasks", json={"prompt": "p"})
    assert posted.status_code == 202, posted.text
    task_id = posted.json()["id"]
    assert (await client.get(f"/v1/tasks/{task_id}")).json()["status"] == "queued"
    cancelled = await client.post(f"/v1/tasks/{task_id}/cancel")
    assert cancelled.json()["status"] == "cancelled", cancelled.text
    replay = await client.get(f"/v1/tasks/{task_id}/events")
    assert replay.status_code == 200
    assert "event: task.finished" in replay.text


async def test_redis_outage_is_503_where_redis_is_needed_and_bugs_stay_500(
    make_settings: Callable[..., Settings], redis_server: PrivateRedis
) -> None:
    settings = make_settings(
        redis_url=redis_server.url, rate_limit_per_s=100, unavailable_retry_after_s=RETRY_AFTER_S
    )
    app = create_app(settings)

    @app.get("/bad-sql")
    async def bad_sql(res: Res) -> None:
        async with res.sessions() as session:
            await session.execute(text("SELECT * FROM no_such_table"))

    @app.get("/own-oserror")
    async def own_oserror() -> None:
        raise ConnectionRefusedError(111, "not a driver's")

    async with serve(app, raise_errors=False) as client:
        assert (await client.get("/metrics")).status_code == 200
        redis_server.kill()
        assert_redis_unavailable(await client.get("/metrics"))
        assert_error(await client.get("/readyz"), 503, "not_ready")
        await carries_on_without_redis(client)
        assert_error(await client.get("/bad-sql"), 500, "internal")
        assert_error(await client.get("/own-oserror"), 500, "internal")
        redis_server.start()
        assert (await client.get("/metrics")).status_code == 200
