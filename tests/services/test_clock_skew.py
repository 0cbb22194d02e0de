"""Leases and deadlines written by one host and compared by another are on Postgres's or
Redis's clock, so a host whose own clock runs ahead neither takes what another host still
holds nor drops what another host still waits for.

The skewed host is this process with its clock moved (time-machine moves `time.time` and
`datetime.now`, not the event loop's monotonic clock, nor Postgres's).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import time_machine
from redis.asyncio import Redis

from app.bus import episodes, files
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.ids import utc_now
from app.services.experiments import scoring as experiment_scoring
from app.services.webhooks import delivery
from tests.support.experiments import insert_scoring_item

AHEAD = timedelta(seconds=700)
"""Past the scoring lease (its timeout 600 s + margin 30 s here) and the webhook lease."""


@contextmanager
def clock_ahead(by: timedelta) -> Iterator[None]:
    with time_machine.travel(datetime.now().astimezone() + by, tick=True):
        assert utc_now() > datetime.now().astimezone() - timedelta(seconds=1)  # moved
        yield


async def test_a_worker_whose_clock_runs_ahead_takes_no_live_scoring_lease(
    sessions: Sessions,
) -> None:
    exp_id = await insert_scoring_item(sessions, {"kind": "llm_judge", "profile": "p"})
    claimed = await experiment_scoring.claim(sessions, limit=100, lease_s=630)
    assert [c.experiment_id for c in claimed].count(exp_id) == 1
    with clock_ahead(AHEAD):
        taken = await experiment_scoring.claim(sessions, limit=100, lease_s=630)
    assert [c for c in taken if c.experiment_id == exp_id] == [], "the lease is still mine"


async def test_a_sender_whose_clock_runs_ahead_takes_no_live_webhook_lease(
    sessions: Sessions, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(webhook_lease_s=60.0, webhook_batch=1000)
    delivery_id = f"whd_{uuid.uuid4().hex[:12]}"
    async with sessions.begin() as session:
        session.add(
            models.WebhookDelivery(
                id=delivery_id,
                event_id="evt_x",
                event_type="task.finished",
                tenant_id="t1",
                subscription_id="whs_x",
                url="http://127.0.0.1:9/",
                body="{}",
                status="pending",
                attempts=0,
                log=[],
                next_attempt_at=utc_now() - timedelta(seconds=1),
            )
        )
    mine = await delivery.claim_due(sessions, settings)
    assert delivery_id in {c.id for c in mine}
    with clock_ahead(AHEAD):
        taken = await delivery.claim_due(sessions, settings)
    assert delivery_id not in {c.id for c in taken}, "leased: one POST at a time"


async def test_a_file_request_is_not_dropped_by_a_worker_whose_clock_runs_ahead(
    redis: Redis,
) -> None:
    """The API's host wrote the deadline (30 s from now); a worker a minute ahead still
    serves the request, and it does expire on time."""
    sent = await files.send(redis, "w-skewed", {"op": "read", "task_id": "tsk_x"}, timeout_s=30)
    request = json.loads(sent.body)
    with clock_ahead(timedelta(seconds=60)):
        assert not await files.expired(redis, request)
    late = await files.send(redis, "w-skewed", {"op": "read", "task_id": "tsk_x"}, timeout_s=0)
    await asyncio.sleep(0.01)
    assert await files.expired(redis, json.loads(late.body))


async def test_an_open_request_is_not_dropped_by_a_worker_whose_clock_runs_ahead(
    redis: Redis,
) -> None:
    await episodes.ensure_group(redis)
    await episodes.request_open(redis, "ep_skew", "extra", ttl_s=30)
    request = await episodes.claim_open(redis, "w-skewed", block_ms=50)
    assert request is not None
    with clock_ahead(timedelta(seconds=60)):
        assert not await request.is_expired(redis)
        assert await episodes.reopen(redis, request), "its caller still waits: passed on"
