"""Reconciliation on real Postgres and Redis: what must run is put back on the queue, once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from app.bus import leases, queue
from app.config import Settings
from app.ids import utc_now
from app.resources import open_resources
from app.runner.episode import Runner
from app.sandbox.docker import DockerHost
from app.worker.context import WorkerContext
from app.worker.reconcile import Reconciler
from tests.support.rows import insert_task
from tests.support.settings import plain_settings

LEASE_S = 0.3


@pytest.fixture
async def ctx(clean_db: str, redis: Redis, private_redis_url: str) -> AsyncIterator[WorkerContext]:
    settings: Settings = plain_settings(
        clean_db, redis_url=private_redis_url, worker_lease_s=LEASE_S, worker_heartbeat_s=0.1
    )
    async with open_resources(settings) as res:
        yield WorkerContext.of(res, Runner(settings, DockerHost()), "w1", "test")


async def test_reconcile_enqueues_what_redis_lost(ctx: WorkerContext) -> None:
    old = utc_now() - timedelta(minutes=1)
    lost_queued = await insert_task(ctx.sessions, created_at=old)
    on_queue = await insert_task(ctx.sessions, created_at=old)
    leased = await insert_task(ctx.sessions, status="running", attempt=1, created_at=old)
    orphan = await insert_task(ctx.sessions, status="running", attempt=1, created_at=old)
    await insert_task(ctx.sessions, status="succeeded", created_at=old)
    young = await insert_task(ctx.sessions)  # its API request may still be enqueueing it
    await queue.enqueue(ctx.redis, on_queue)
    await leases.acquire(ctx.redis, leased, leases.holder_of("w2", "1-0"), 60_000)
    reconciler = Reconciler(ctx)

    assert await reconciler.run_once() == [lost_queued]
    assert await queue.queued_task_ids(ctx.redis) == {lost_queued, on_queue}
    # The orphan's lease may only be in flux (a restarted Redis): it gets a lease period.
    await asyncio.sleep(LEASE_S + 0.1)
    assert await reconciler.run_once() == [orphan]
    assert await reconciler.run_once() == [], "enqueued once"
    assert young not in await queue.queued_task_ids(ctx.redis)


async def test_a_lease_taken_back_in_time_is_not_reconciled(ctx: WorkerContext) -> None:
    old = utc_now() - timedelta(minutes=1)
    running = await insert_task(ctx.sessions, status="running", attempt=1, created_at=old)
    reconciler = Reconciler(ctx)
    assert await reconciler.run_once() == []
    await leases.acquire(ctx.redis, running, leases.holder_of("w2", "1-0"), 60_000)
    await asyncio.sleep(LEASE_S + 0.1)
    assert await reconciler.run_once() == []
