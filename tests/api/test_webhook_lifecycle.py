"""The lifecycle events callers ask peers for, and redelivery: `episode.closed` written with
the close, `task.expiring` while a task still runs (not once it ended or another attempt
took it), a subscription's own delivery log, and a past delivery sent again, byte for byte,
to a real loopback receiver. (`task.expiring` from a running worker: tests/worker.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import select

from app.api.app import create_app
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.ids import utc_now
from app.services.episodes import service as episodes
from app.services.tasks import attempts
from tests.api.conftest import assert_error, serve
from tests.api.test_webhooks import allowing, check_signed, send_until_settled, subscribe
from tests.support.rows import insert_task
from tests.support.webhook_receiver import receiver


async def insert_episode(sessions: Sessions, status: str = "open") -> str:
    row = models.EpisodeRow(
        id=episodes.new_episode_id(),
        tenant_id="default",
        status=status,
        prompt="do it",
        spec={},
        scorer=None,
        ground_truth=None,
    )
    async with sessions.begin() as session:
        session.add(row)
    return row.id


async def test_episode_closed_is_sent_as_the_episode_closes_and_once(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings)
    async with receiver() as rec, serve(create_app(settings)) as client:
        sub = await subscribe(client, rec.url(), ["episode.closed"])
        closed = await insert_episode(sessions)
        done = await insert_episode(sessions)
        assert await episodes.end(sessions, closed, status="closed", finish_reason="closed")
        assert not await episodes.end(sessions, closed, status="closed", finish_reason="idle")
        assert await episodes.end(sessions, done, status="done", finish_reason="submitted")
        await send_until_settled(settings)
        assert len(rec.received) == 1, "a `done` episode is not closed yet"
        await episodes.close_done(sessions, done)  # the trainer deletes it
        await episodes.close_done(sessions, done)
        await send_until_settled(settings)
        bodies = check_signed(rec, sub["secret"])
        assert [(b["type"], b["data"]["id"]) for b in bodies] == [
            ("episode.closed", closed),
            ("episode.closed", done),
        ]
        for body in bodies:
            shown = (await client.get(f"/v1/episodes/{body['data']['id']}")).json()
            assert body["data"] == shown
            assert shown["status"] == "closed"
        log = (await client.get(f"/v1/webhooks/{sub['id']}/deliveries")).json()["deliveries"]
        assert [d["event_id"] for d in log] == [b["id"] for b in reversed(bodies)]  # newest first


async def test_task_expiring_is_written_only_while_that_attempt_runs(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings)
    async with receiver() as rec, serve(create_app(settings)) as client:
        await subscribe(client, rec.url(), ["task.expiring"])
        running = await insert_task(sessions, status="running", attempt=2)
        ended = await insert_task(sessions, status="succeeded", attempt=1)
        at = utc_now() + timedelta(seconds=60)
        assert await attempts.task_expiring(sessions, running, 2, at)
        assert not await attempts.task_expiring(sessions, running, 1, at), "an older attempt"
        assert not await attempts.task_expiring(sessions, ended, 1, at)
        await send_until_settled(settings)
        (got,) = rec.received
        body = json.loads(got.body)
        assert (body["type"], body["data"]["id"]) == ("task.expiring", running)
        assert body["data"]["expires_at"] == at.isoformat()
        assert body["data"]["status"] == "running"


async def test_a_past_delivery_is_sent_again_byte_for_byte_and_logged(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings, auth="keys", admin_api_key="sk-admin-lifecycle-0123456789")
    alice = {"Authorization": "Bearer sk-admin-lifecycle-0123456789", "X-Sandhive-Tenant": "a"}
    bob = {**alice, "X-Sandhive-Tenant": "b"}
    async with receiver() as rec, serve(create_app(settings)) as client:
        sub = await subscribe(client, rec.url(), ["task.finished"], headers=alice)
        task_id = await insert_task(sessions, tenant="a")
        assert (await client.post(f"/v1/tasks/{task_id}/cancel", headers=alice)).status_code == 202
        await send_until_settled(settings)
        [first] = (await client.get(f"/v1/tasks/{task_id}/webhooks", headers=alice)).json()[
            "deliveries"
        ]
        url = f"/v1/webhooks/deliveries/{first['id']}/redeliver"
        assert_error(await client.post(url, headers=bob), 404, "not_found")
        again = await client.post(url, headers=alice)
        assert again.status_code == 202, again.text
        made = again.json()
        assert (made["event_id"], made["status"], made["attempts"]) == (
            first["event_id"],
            "pending",
            [],
        )
        assert made["id"] != first["id"]
        await send_until_settled(settings)
        assert len(rec.received) == 2
        assert rec.received[0].body == rec.received[1].body  # the same event, the same bytes
        assert rec.received[1].headers["webhook-id"] == first["event_id"]
        check_signed(rec, sub["secret"])
        log = (await client.get(f"/v1/tasks/{task_id}/webhooks", headers=alice)).json()
        assert [d["status"] for d in log["deliveries"]] == ["delivered", "delivered"]
        assert (await client.delete(f"/v1/webhooks/{sub['id']}", headers=alice)).status_code == 204
        assert_error(await client.post(url, headers=alice), 409, "conflict")
        missing = "/v1/webhooks/deliveries/whd_nope/redeliver"
        assert_error(await client.post(missing, headers=alice), 404, "not_found")
    async with sessions() as session:
        rows = await session.scalars(
            select(models.WebhookDelivery).where(models.WebhookDelivery.task_id == task_id)
        )
        assert len(list(rows)) == 2, "the refused redelivery wrote nothing"
