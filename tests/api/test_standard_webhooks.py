"""Standard Webhooks: real deliveries to a loopback receiver, verified unchanged by the spec's
own libraries (`standardwebhooks` and `svix`, pinned in the dev extra) with the secret as the
API gave it out, during a rotation's overlap with either secret, and by the Python client's
verifier from the headers as they arrived. The deprecated `Sandhive-Signature` still comes
alongside.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import standardwebhooks
import svix.webhooks
from sandhive_client import WebhookVerificationError, verify_webhook
from sqlalchemy import update

from app.api.app import create_app
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.services.webhooks.delivery import signature_headers
from tests.api.conftest import assert_error, serve
from tests.api.test_webhooks import allowing, send_until_settled, subscribe
from tests.support.rows import insert_task
from tests.support.webhook_receiver import Receiver, receiver, verify


def standard_libraries_verify(secret: str, got: Any) -> None:
    """Both libraries accept the delivery as it arrived, and refuse it changed by a byte."""
    headers = dict(got.headers)
    assert standardwebhooks.Webhook(secret).verify(got.body, headers) == json.loads(got.body)
    svix.webhooks.Webhook(secret).verify(got.body, headers)  # raises when it does not verify
    for library in (standardwebhooks.Webhook(secret), svix.webhooks.Webhook(secret)):
        with pytest.raises(Exception, match=r"(?i)signature"):
            library.verify(got.body + b" ", headers)


async def one_delivery(
    client: httpx.AsyncClient, settings: Settings, sessions: Sessions, rec: Receiver
) -> Any:
    task_id = await insert_task(sessions)
    assert (await client.post(f"/v1/tasks/{task_id}/cancel")).status_code == 202
    await send_until_settled(settings)
    got = rec.received[-1]
    return got


async def test_both_standard_libraries_verify_a_real_delivery_with_the_secret_as_given(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings)
    async with receiver() as rec, serve(create_app(settings)) as client:
        sub = await subscribe(client, rec.url(), ["task.finished"])
        got = await one_delivery(client, settings, sessions, rec)
    secret = sub["secret"]
    assert secret.startswith("whsec_")
    standard_libraries_verify(secret, got)
    body = got.body
    assert got.headers["webhook-id"] == got.headers["sandhive-event-id"]
    assert abs(int(got.headers["webhook-timestamp"]) - time.time()) < 60
    assert got.headers["webhook-signature"].startswith("v1,")
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook("whsec_" + "A" * 44).verify(body, dict(got.headers))

    # The deprecated header still comes, under the same secret.
    assert verify(secret, got.headers["sandhive-signature"], body)
    # The client's verifier: the standard headers as they arrived, or the old header alone.
    stamp = int(got.headers["webhook-timestamp"])
    assert verify_webhook(secret, dict(got.headers), body) == stamp
    assert verify_webhook(secret, got.headers["sandhive-signature"], body) == stamp
    with pytest.raises(WebhookVerificationError):
        verify_webhook(secret, dict(got.headers), body + b" ")
    forged = {**dict(got.headers), "webhook-id": "evt_other"}  # the id is signed too
    with pytest.raises(WebhookVerificationError):
        verify_webhook(secret, forged, body)


async def test_a_rotation_with_overlap_signs_with_both_secrets_until_it_ends(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings)
    async with receiver() as rec, serve(create_app(settings)) as client:
        sub = await subscribe(client, rec.url(), ["task.finished"])
        rotated = await client.post(f"/v1/webhooks/{sub['id']}/rotate", json={"overlap_s": 3600})
        assert rotated.status_code == 200, rotated.text
        new = rotated.json()
        until = datetime.fromisoformat(new["previous_secret_until"])
        assert timedelta(minutes=59) < until - datetime.now(UTC) <= timedelta(hours=1)
        during = await one_delivery(client, settings, sessions, rec)
        assert len(during.headers["webhook-signature"].split(" ")) == 2
        for secret in (sub["secret"], new["secret"]):  # a receiver on either secret accepts it
            standard_libraries_verify(secret, during)
            assert verify(secret, during.headers["sandhive-signature"], during.body)
            assert verify_webhook(secret, dict(during.headers), during.body)

        async with sessions.begin() as session:  # the overlap ends
            await session.execute(
                update(models.WebhookSubscription)
                .where(models.WebhookSubscription.id == sub["id"])
                .values(previous_until=datetime.now(UTC) - timedelta(seconds=1))
            )
        after = await one_delivery(client, settings, sessions, rec)
        listed = (await client.get("/v1/webhooks")).json()["webhooks"]
        assert listed[0]["previous_secret_until"] is None
        for bad in ({"overlap_s": -1}, {"overlap_s": 8 * 24 * 3600}, {"overlap": 5}):
            refused = await client.post(f"/v1/webhooks/{sub['id']}/rotate", json=bad)
            assert_error(refused, 422, "invalid_input")
    standard_libraries_verify(new["secret"], after)
    assert len(after.headers["webhook-signature"].split(" ")) == 1
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(sub["secret"]).verify(after.body, dict(after.headers))


def test_a_secret_from_before_the_standard_form_gets_the_old_header_alone() -> None:
    """A subscription made by an earlier release (`whsec_` + URL-safe text, which the
    standard libraries cannot decode) keeps being signed as before until it is rotated."""
    headers = signature_headers(("whsec_abc-def_ghi",), "evt_1", b"{}", 1_700_000_000)
    assert set(headers) == {"Sandhive-Signature"}
    assert verify("whsec_abc-def_ghi", headers["Sandhive-Signature"], b"{}")
    stamp = verify_webhook("whsec_abc-def_ghi", headers, b"{}", now=1_700_000_000)
    assert stamp == 1_700_000_000
