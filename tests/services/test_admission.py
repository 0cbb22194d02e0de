"""Admitting a task: queue depth and per-tenant limits, and acceptance while Redis is down."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from app.config import Settings
from app.db.engine import Sessions
from app.errors import TooManyRequests
from app.schemas import TaskCreate
from app.services import tasks
from tests.support.processes import free_port
from tests.support.rows import insert_task


def body() -> TaskCreate:
    return TaskCreate(prompt="compute")


async def test_queue_depth_limit_counts_queued_tasks_of_everyone(
    sessions: Sessions, redis: Redis, service_settings: Settings
) -> None:
    settings = service_settings.model_copy(update={"queue_max_depth": 2})
    await insert_task(sessions, tenant="other")
    await insert_task(sessions, tenant="other", status="running")
    await tasks.submit_task(sessions, redis, settings, "acme", body(), None)
    with pytest.raises(TooManyRequests) as caught:
        await tasks.submit_task(sessions, redis, settings, "acme", body(), None)
    assert caught.value.retry_after_s == settings.backpressure_retry_after_s
    assert caught.value.details == {"limit": "queue_max_depth", "value": 2}


async def test_tenant_limit_counts_only_that_tenants_active_tasks(
    sessions: Sessions, redis: Redis, service_settings: Settings
) -> None:
    settings = service_settings.model_copy(update={"tenant_max_active_tasks": 2})
    await insert_task(sessions, tenant="acme", status="running")
    await insert_task(sessions, tenant="acme", status="succeeded")
    await insert_task(sessions, tenant="other", status="running")
    await tasks.submit_task(sessions, redis, settings, "acme", body(), None)
    with pytest.raises(TooManyRequests) as caught:
        await tasks.submit_task(sessions, redis, settings, "acme", body(), None)
    assert caught.value.details == {"limit": "tenant_max_active_tasks", "value": 2}
    created, _ = await tasks.submit_task(sessions, redis, settings, "other", body(), None)
    assert created.status == "queued", "another tenant is not held back"


async def test_tenant_limit_is_exact_under_concurrent_submissions(
    sessions: Sessions, redis: Redis, service_settings: Settings
) -> None:
    settings = service_settings.model_copy(update={"tenant_max_active_tasks": 3})
    results = await asyncio.gather(
        *(tasks.submit_task(sessions, redis, settings, "acme", body(), None) for _ in range(10)),
        return_exceptions=True,
    )
    accepted = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, TooManyRequests)]
    assert (len(accepted), len(refused)) == (3, 7)


async def test_an_idempotent_repeat_is_answered_even_over_the_limit(
    sessions: Sessions, redis: Redis, service_settings: Settings
) -> None:
    settings = service_settings.model_copy(update={"tenant_max_active_tasks": 1})
    first, created = await tasks.submit_task(sessions, redis, settings, "acme", body(), "k1")
    again, created_again = await tasks.submit_task(sessions, redis, settings, "acme", body(), "k1")
    assert (created, created_again, again.id) == (True, False, first.id)


async def test_a_task_is_accepted_while_redis_is_down(
    sessions: Sessions, service_settings: Settings
) -> None:
    """Committed first: the enqueue failing leaves a queued row that reconciliation enqueues."""
    dead = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    try:
        task, created = await tasks.submit_task(
            sessions, dead, service_settings, "acme", body(), None
        )
    finally:
        await dead.aclose()
    assert (created, task.status) == (True, "queued")
    assert (await tasks.get_task(sessions, "acme", task.id)).status == "queued"
