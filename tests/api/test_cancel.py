"""`POST /v1/tasks/{id}/cancel`, the 429s of backpressure, and the trajectory's `attempt` filter."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import select

from app.api.app import create_app
from app.bus import cancel
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.services import keys
from tests.api.conftest import assert_error, serve
from tests.support.rows import insert_step, insert_task


async def event_types(sessions: Sessions, task_id: str) -> list[str]:
    async with sessions() as session:
        query = select(models.Event.type).where(models.Event.task_id == task_id)
        return list(await session.scalars(query.order_by(models.Event.seq)))


async def test_cancelling_a_queued_task_ends_it_at_once(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    task_id = await insert_task(sessions)
    response = await client.post(f"/v1/tasks/{task_id}/cancel")
    assert response.status_code == 202, response.text
    body = response.json()
    assert (body["id"], body["status"], body["finish_reason"]) == (
        task_id,
        "cancelled",
        "cancelled",
    )
    assert body["finished_at"] is not None
    assert await event_types(sessions, task_id) == ["task.finished"]

    again = await client.post(f"/v1/tasks/{task_id}/cancel")
    error = assert_error(again, 409, "conflict")
    assert "already finished" in error["message"]


async def test_cancelling_a_running_task_asks_its_worker(
    client: httpx.AsyncClient, sessions: Sessions, redis: Redis
) -> None:
    task_id = await insert_task(sessions, status="running", attempt=1)
    response = await client.post(f"/v1/tasks/{task_id}/cancel")
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "running", "the worker ends it, with its output"
    async with sessions() as session:
        row = await session.get_one(models.Task, task_id)
    assert row.cancel_requested_at is not None, "durable: survives a Redis that loses its data"
    assert await cancel.flagged(redis, [task_id]) == {task_id}
    assert (await client.post(f"/v1/tasks/{task_id}/cancel")).status_code == 202, "idempotent"


@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled"])
async def test_cancelling_a_finished_task_is_409(
    client: httpx.AsyncClient, sessions: Sessions, status: str
) -> None:
    task_id = await insert_task(sessions, status=status)
    assert_error(await client.post(f"/v1/tasks/{task_id}/cancel"), 409, "conflict")


async def test_cancelling_an_unknown_or_foreign_task_is_404(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    foreign = await insert_task(sessions, tenant="someone-else")
    for task_id in ("tsk_nope", foreign):
        assert_error(await client.post(f"/v1/tasks/{task_id}/cancel"), 404, "not_found")
    async with sessions() as session:
        assert (await session.get_one(models.Task, foreign)).status == "queued"


@pytest.fixture
async def small_queue(api_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    settings = api_settings.model_copy(
        update={"queue_max_depth": 1, "backpressure_retry_after_s": 7}
    )
    async with serve(create_app(settings)) as client:
        yield client


async def test_a_full_queue_answers_429_with_retry_after(
    small_queue: httpx.AsyncClient, sessions: Sessions
) -> None:
    assert (await small_queue.post("/v1/tasks", json={"prompt": "one"})).status_code == 202
    response = await small_queue.post("/v1/tasks", json={"prompt": "two"})
    error = assert_error(response, 429, "too_many_requests")
    assert response.headers["Retry-After"] == "7"
    assert error["details"] == {"limit": "queue_max_depth", "value": 1}
    async with sessions() as session:
        assert len((await session.scalars(select(models.Task))).all()) == 1, "nothing stored"


async def test_a_tenant_at_its_active_task_cap_gets_429_others_do_not(
    api_settings: Settings, sessions: Sessions
) -> None:
    """`tenant_max_active_tasks` is per tenant: one tenant's backlog never blocks another."""
    settings = api_settings.model_copy(
        update={"auth": "keys", "tenant_max_active_tasks": 1, "backpressure_retry_after_s": 9}
    )
    first = await keys.create_key(sessions, "tenant-a")
    other = await keys.create_key(sessions, "tenant-b")
    async with serve(create_app(settings)) as client:

        async def submit(key: str, prompt: str) -> httpx.Response:
            headers = {"Authorization": f"Bearer {key}"}
            return await client.post("/v1/tasks", json={"prompt": prompt}, headers=headers)

        assert (await submit(first.key, "one")).status_code == 202
        response = await submit(first.key, "two")
        error = assert_error(response, 429, "too_many_requests")
        assert response.headers["Retry-After"] == "9"
        assert error["details"] == {"limit": "tenant_max_active_tasks", "value": 1}
        accepted = await submit(other.key, "another tenant")
        assert accepted.status_code == 202, accepted.text
    async with sessions() as session:
        rows = (await session.execute(select(models.Task.tenant_id, models.Task.prompt))).all()
    assert sorted(rows) == [("tenant-a", "one"), ("tenant-b", "another tenant")]


async def test_trajectory_can_be_read_per_attempt(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    task_id = await insert_task(sessions, status="running", attempt=2)
    for attempt, index in ((1, 0), (1, 1), (2, 0)):
        await insert_step(sessions, task_id, attempt, index)
    every = (await client.get(f"/v1/tasks/{task_id}/trajectory")).json()["steps"]
    assert [(s["attempt"], s["index"]) for s in every] == [(1, 0), (1, 1), (2, 0)]
    second = (await client.get(f"/v1/tasks/{task_id}/trajectory?attempt=2")).json()["steps"]
    assert [(s["attempt"], s["index"]) for s in second] == [(2, 0)]
    assert_error(
        await client.get(f"/v1/tasks/{task_id}/trajectory?attempt=0"), 422, "invalid_input"
    )
