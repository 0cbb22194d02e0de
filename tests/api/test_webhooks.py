"""Webhooks: subscriptions, the outbox written with each state change, signed deliveries to a
real loopback receiver, retries, the delivery log, SSRF refusals, tenants and rotation."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from app.api.app import create_app
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.resources import open_resources
from app.services.tasks import attempts
from app.services.webhooks import delivery as webhook_delivery
from app.services.webhooks import service as webhooks_service
from app.worker.webhook_sender import send_due
from tests.api.conftest import assert_error, serve
from tests.support.experiments import ADMIN_KEY, as_tenant, experiment
from tests.support.rows import insert_task
from tests.support.webhook_receiver import Receiver, receiver, verify

FAST_RETRIES: dict[str, Any] = {"webhook_retry_base_s": 0.05, "webhook_retry_max_delay_s": 0.2}


def allowing(make_settings: Callable[..., Settings], **more: Any) -> Settings:
    return make_settings(webhook_allowed_hosts=["127.0.0.1"], **FAST_RETRIES, **more)


async def subscribe(
    client: httpx.AsyncClient, url: str, events: list[str], **kw: Any
) -> dict[str, Any]:
    created = await client.post("/v1/webhooks", json={"url": url, "events": events}, **kw)
    assert created.status_code == 201, created.text
    return dict(created.json())


async def send_until_settled(settings: Settings, rounds: int = 60) -> None:
    """Run the worker's sender chore until nothing is pending (retries come due quickly)."""
    async with open_resources(settings) as res:
        for _ in range(rounds):
            await send_due(res.sessions, settings)
            async with res.sessions() as session:
                pending = await session.scalar(
                    select(models.WebhookDelivery.id).where(
                        models.WebhookDelivery.status == "pending"
                    )
                )
            if pending is None:
                return
            await asyncio.sleep(0.05)
    raise AssertionError("deliveries still pending")


def check_signed(rec: Receiver, secret: str) -> list[dict[str, Any]]:
    bodies = []
    for got in rec.received:
        header = got.headers["sandhive-signature"]
        assert verify(secret, header, got.body), header
        t = int(dict(item.split("=", 1) for item in header.split(","))["t"])
        assert abs(time.time() - t) < 60
        bodies.append(json.loads(got.body))
    return bodies


async def test_a_signed_webhook_arrives_with_the_task_as_get_returns_it(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings)
    async with receiver() as rec, serve(create_app(settings)) as client:
        sub = await subscribe(client, rec.url(), ["task.finished"])
        assert sub["secret"].startswith("whsec_")
        assert sub["events"] == ["task.finished"]
        listed = (await client.get("/v1/webhooks")).json()["webhooks"]
        assert [w["id"] for w in listed] == [sub["id"]]
        assert "secret" not in listed[0]
        task_id = await insert_task(sessions)
        assert (await client.post(f"/v1/tasks/{task_id}/cancel")).status_code == 202
        await send_until_settled(settings)
        [body] = check_signed(rec, sub["secret"])
        assert not verify(
            "whsec_wrong", rec.received[0].headers["sandhive-signature"], rec.received[0].body
        )
        assert body["type"] == "task.finished"
        assert body["id"].startswith("evt_")
        assert rec.received[0].headers["sandhive-event-id"] == body["id"]
        assert body["data"] == (await client.get(f"/v1/tasks/{task_id}")).json()
        assert body["data"]["status"] == "cancelled"
        log = (await client.get(f"/v1/tasks/{task_id}/webhooks")).json()["deliveries"]
        assert [(d["status"], d["event_id"], d["type"]) for d in log] == [
            ("delivered", body["id"], "task.finished")
        ]
        assert [(a["attempt"], a["status_code"], a["error"]) for a in log[0]["attempts"]] == [
            (1, 200, None)
        ]


async def test_the_receiver_fails_twice_and_the_third_delivery_lands(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings)
    async with receiver([500, 500]) as rec, serve(create_app(settings)) as client:
        sub = await subscribe(client, rec.url(), ["task.finished"])
        task_id = await insert_task(sessions)
        await client.post(f"/v1/tasks/{task_id}/cancel")
        await send_until_settled(settings)
        bodies = check_signed(rec, sub["secret"])
        assert len(bodies) == 3
        assert len({b["id"] for b in bodies}) == 1, "one event, retried"
        assert len({got.body for got in rec.received}) == 1, "the same bytes every time"
        [log] = (await client.get(f"/v1/tasks/{task_id}/webhooks")).json()["deliveries"]
        assert log["status"] == "delivered"
        assert log["next_attempt_at"] is None
        tries = log["attempts"]
        assert [(a["attempt"], a["status_code"]) for a in tries] == [(1, 500), (2, 500), (3, 200)]
        assert [a["error"] for a in tries] == ["HTTP 500", "HTTP 500", None]
        assert all(a["next_retry_at"] is not None for a in tries[:2])
        assert tries[2]["next_retry_at"] is None


async def test_a_receiver_that_never_answers_2xx_is_given_up_on_in_bounded_time(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings, webhook_retry_for_s=0.5)
    async with receiver([500] * 100) as rec, serve(create_app(settings)) as client:
        await subscribe(client, rec.url(), ["task.finished"])
        task_id = await insert_task(sessions)
        await client.post(f"/v1/tasks/{task_id}/cancel")
        await send_until_settled(settings)
        [log] = (await client.get(f"/v1/tasks/{task_id}/webhooks")).json()["deliveries"]
        assert log["status"] == "failed"
        assert log["attempts"][-1]["next_retry_at"] is None
        assert 2 <= len(log["attempts"]) == len(rec.received) < 20


async def test_an_api_restart_between_the_change_and_the_delivery_loses_nothing(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings)
    async with receiver() as rec:
        async with serve(create_app(settings)) as client:
            sub = await subscribe(client, rec.url(), ["task.finished"])
            task_id = await insert_task(sessions)
            await client.post(f"/v1/tasks/{task_id}/cancel")
        # The API is gone and no sender ran: the outbox row was committed with the change.
        async with sessions() as session:
            rows = list(await session.scalars(select(models.WebhookDelivery)))
        assert [(r.task_id, r.status, r.attempts) for r in rows] == [(task_id, "pending", 0)]
        assert rec.received == []
        await send_until_settled(settings)  # a worker's sender, after the restart
        async with serve(create_app(settings)) as client:
            [body] = check_signed(rec, sub["secret"])
            assert body["data"]["id"] == task_id
            log = (await client.get(f"/v1/tasks/{task_id}/webhooks")).json()["deliveries"]
            assert [d["status"] for d in log] == ["delivered"]


async def test_task_started_is_sent_when_an_attempt_starts(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings)
    async with receiver() as rec, serve(create_app(settings)) as client:
        sub = await subscribe(client, rec.url(), ["task.started"])
        task_id = await insert_task(sessions)
        async with open_resources(settings) as res:
            started = await attempts.start_attempt(
                res.sessions, res.redis, task_id, "w1", max_attempts=3
            )
        assert started is not None
        await send_until_settled(settings)
        [body] = check_signed(rec, sub["secret"])
        assert body["type"] == "task.started"
        assert (body["data"]["id"], body["data"]["status"], body["data"]["attempt"]) == (
            task_id,
            "running",
            1,
        )


async def test_experiment_finished_is_sent_when_it_is_cancelled(
    make_settings: Callable[..., Settings],
) -> None:
    settings = allowing(make_settings)
    async with receiver() as rec, serve(create_app(settings)) as client:
        sub = await subscribe(client, rec.url(), ["experiment.finished"])
        exp = (await client.post("/v1/experiments", json=experiment())).json()
        url = f"/v1/experiments/{exp['id']}"
        assert (await client.post(f"{url}/cancel")).status_code == 202
        assert (await client.post(f"{url}/cancel")).status_code == 202  # no second event
        await send_until_settled(settings)
        bodies = check_signed(rec, sub["secret"])
        assert [(b["type"], b["data"]["id"], b["data"]["status"]) for b in bodies] == [
            ("experiment.finished", exp["id"], "cancelled")
        ]
        assert set(bodies[0]["data"]) == set((await client.get(url)).json())
        [log] = (await client.get(f"{url}/webhooks")).json()["deliveries"]
        assert (log["type"], log["status"], log["event_id"]) == (
            "experiment.finished",
            "delivered",
            bodies[0]["id"],
        )
        assert_error(await client.get("/v1/experiments/exp_nope/webhooks"), 404, "not_found")


async def assert_refused_at_registration(client: httpx.AsyncClient, url: str) -> None:
    refused = await client.post("/v1/webhooks", json={"url": url, "events": ["task.finished"]})
    assert_error(refused, 422, "invalid_input")


async def test_plainly_private_urls_are_refused_at_registration(
    make_settings: Callable[..., Settings],
) -> None:
    async with serve(create_app(make_settings())) as client:
        for url in (
            "http://127.0.0.1:8080/hook",
            "http://localhost/hook",
            "http://[::1]/hook",
            "http://10.1.2.3/hook",
            "http://192.168.0.7/hook",
            "http://169.254.169.254/latest/meta-data",
            "http://[::ffff:127.0.0.1]/hook",
            "ftp://example.com/hook",
            "https://user:pw@example.com/hook",
            "not a url",
            "http://example.com:99999/hook",
            "http://100.100.100.200/latest",
        ):
            await assert_refused_at_registration(client, url)
        bad_event = await client.post(
            "/v1/webhooks", json={"url": "https://example.com/h", "events": ["task.exploded"]}
        )
        assert bad_event.status_code == 422
        assert (await client.get("/v1/webhooks")).json()["webhooks"] == []
        public = await client.post(
            "/v1/webhooks", json={"url": "https://example.com/h", "events": ["task.finished"]}
        )
        assert public.status_code == 201, public.text
    async with serve(create_app(allowing(make_settings))) as client:
        await subscribe(client, "http://127.0.0.1:8080/hook", ["task.finished"])


WRAPPED_INTERNAL = {
    "compatible": "::127.0.0.1",
    "nat64": "64:ff9b::127.0.0.1",
    "translated": "::ffff:0:169.254.169.254",
    "compatible-metadata": "::169.254.169.254",
    "sixtofour": "2002:7f00:1::",
}
"""IPv6 forms of loopback and the metadata service (issue #28): the IPv4 address they carry
decides, as in the egress proxy (`app.egress.rules`)."""


async def test_ipv6_forms_of_internal_addresses_are_a_422_at_registration(
    make_settings: Callable[..., Settings],
) -> None:
    async with serve(create_app(make_settings())) as client:
        await subscribe(client, "https://example.com/sub", ["task.finished"])
        for address in WRAPPED_INTERNAL.values():
            url = f"http://[{address}]/hook"
            refused = await client.post(
                "/v1/webhooks", json={"url": url, "events": ["task.finished"]}
            )
            assert "not a public address" in assert_error(refused, 422, "invalid_input")["message"]
            refused = await client.post("/v1/tasks", json={"prompt": "x", "webhook": {"url": url}})
            error = assert_error(refused, 422, "invalid_input")
            assert error["details"][0]["loc"] == ["body", "webhook", "url"], error
        assert len((await client.get("/v1/webhooks")).json()["webhooks"]) == 1
        assert (await client.get("/v1/tasks")).json()["items"] == []


async def test_a_name_answering_an_ipv6_form_of_an_internal_address_is_not_connected_to(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    """A name passes registration (no DNS there); at send time it resolves (here through
    `webhook_hosts`) to a wrapped loopback or metadata address, and the sender refuses it
    instead of connecting."""
    settings = make_settings(
        webhook_hosts=[f"{name}.sandhive.test={a}" for name, a in WRAPPED_INTERNAL.items()],
        webhook_retry_for_s=0.01,
    )
    async with serve(create_app(settings)) as client:
        for name in WRAPPED_INTERNAL:
            await subscribe(client, f"http://{name}.sandhive.test/hook", ["task.finished"])
        task_id = await insert_task(sessions)
        await client.post(f"/v1/tasks/{task_id}/cancel")
        await send_until_settled(settings)
        log = (await client.get(f"/v1/tasks/{task_id}/webhooks")).json()["deliveries"]
        assert len(log) == len(WRAPPED_INTERNAL)
        errors = sorted(d["attempts"][0]["error"].split(": address")[0] for d in log)
        assert errors == sorted(
            f"refused: {name}.sandhive.test resolves to {ipaddress.ip_address(a)}, "
            "which is not a public address"
            for name, a in WRAPPED_INTERNAL.items()
        ), errors
        assert [d["status"] for d in log] == ["failed"] * len(WRAPPED_INTERNAL)


async def test_hosts_a_resolver_reads_as_internal_addresses_are_a_422_at_registration(
    make_settings: Callable[..., Settings],
) -> None:
    """What `urlsplit` calls a name but the resolver reads as loopback (`inet_aton`'s short,
    octal and hexadecimal forms, full-width digits and letters the IDNA codec folds): judged
    as the resolver reads it, so refused before it is stored."""
    async with serve(create_app(make_settings())) as client:
        for host in (
            "0x7f.1",
            "2130706433",
            "127.1",
            "0177.0.0.1",
            "0x7f000001",
            "0xa9.0xfe.0xa9.0xfe",
            "\uff11\uff12\uff17.0.0.1",  # full-width 127
            "\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54",  # full-width localhost
            "localhost\u3002",  # an ideographic full stop ends the name
        ):
            await assert_refused_at_registration(client, f"http://{host}/hook")
        assert (await client.get("/v1/webhooks")).json()["webhooks"] == []


async def test_a_webhook_to_an_internationalized_name_is_sent_as_its_ascii_form(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    """The resolver, `webhook_hosts`, the Host header and TLS SNI all see `xn--bcher-kva...`."""
    settings = allowing(make_settings, webhook_hosts=["xn--bcher-kva.sandhive.test=127.0.0.1"])
    sent = await delivered_once(settings, sessions, "B\u00fccher.sandhive.test")
    assert sent.headers["host"] == f"xn--bcher-kva.sandhive.test:{sent.port}"


@dataclass(frozen=True)
class Sent:
    """What a receiver got: the request's headers, and the port it listened on."""

    headers: Mapping[str, str]
    port: int


async def delivered_once(settings: Settings, sessions: Sessions, host: str) -> Sent:
    """A task's `task.finished` to a receiver named `host`: delivered once, signed; what came."""
    async with receiver() as rec, serve(create_app(settings)) as client:
        sub = await subscribe(client, rec.url(host=host), ["task.finished"])
        task_id = await insert_task(sessions)
        await client.post(f"/v1/tasks/{task_id}/cancel")
        await send_until_settled(settings)
        log = (await client.get(f"/v1/tasks/{task_id}/webhooks")).json()["deliveries"]
        assert [d["status"] for d in log] == ["delivered"], log
        assert len(check_signed(rec, sub["secret"])) == 1
        return Sent(rec.received[0].headers, rec.port)


async def test_a_name_resolving_to_loopback_is_refused_at_send_time(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    """Registered while `localhost` was allowed; the sender (without the allow) resolves the
    name, finds 127.0.0.1 and does not connect."""
    registering = make_settings(webhook_allowed_hosts=["localhost"], **FAST_RETRIES)
    sending = make_settings(webhook_retry_for_s=0.01)
    async with receiver() as rec, serve(create_app(registering)) as client:
        first = await subscribe(client, rec.url(host="localhost"), ["task.finished"])
        task_id = await insert_task(sessions)
        await client.post(f"/v1/tasks/{task_id}/cancel")
        await send_until_settled(sending)
        assert rec.received == []
        [log] = (await client.get(f"/v1/tasks/{task_id}/webhooks")).json()["deliveries"]
        [attempt] = log["attempts"]
        assert attempt["status_code"] is None
        assert attempt["error"].startswith("refused: localhost resolves to"), attempt
        assert log["status"] == "failed"
        await client.delete(f"/v1/webhooks/{first['id']}")
    # The same name, allowed at send time too, is delivered.
    sent = await delivered_once(registering, sessions, "localhost")
    assert sent.headers["host"] == f"localhost:{sent.port}", "the name, not the IP"


async def test_webhook_hosts_answer_a_name_without_dns(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    """`webhook_hosts` (split horizon, tests): a name no DNS knows is sent to its address,
    as the name (Host header), and the allowed-address rule still decides."""
    settings = allowing(make_settings, webhook_hosts=["hooks.sandhive.test=127.0.0.1"])
    sent = await delivered_once(settings, sessions, "hooks.sandhive.test")
    assert sent.headers["host"] == f"hooks.sandhive.test:{sent.port}"


async def test_redirects_are_not_followed(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings, webhook_retry_for_s=0.01)
    async with receiver([302]) as rec, serve(create_app(settings)) as client:
        await subscribe(client, rec.url(), ["task.finished"])
        task_id = await insert_task(sessions)
        await client.post(f"/v1/tasks/{task_id}/cancel")
        await send_until_settled(settings)
        assert len(rec.received) == 1
        [log] = (await client.get(f"/v1/tasks/{task_id}/webhooks")).json()["deliveries"]
        assert log["attempts"][0]["status_code"] == 302
        assert log["status"] == "failed"


async def test_tenants_see_and_get_only_their_own(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings, auth="keys", admin_api_key=ADMIN_KEY)
    a, b = as_tenant("acme"), as_tenant("bolt")
    async with receiver() as rec_a, receiver() as rec_b, serve(create_app(settings)) as client:
        sub_a = await subscribe(client, rec_a.url(), ["task.finished"], headers=a)
        await subscribe(client, rec_b.url(), ["task.finished"], headers=b)
        listed = (await client.get("/v1/webhooks", headers=b)).json()["webhooks"]
        assert sub_a["id"] not in [w["id"] for w in listed]
        for method, path in (
            ("DELETE", f"/v1/webhooks/{sub_a['id']}"),
            ("POST", f"/v1/webhooks/{sub_a['id']}/rotate"),
        ):
            assert_error(await client.request(method, path, headers=b), 404, "not_found")
        task_id = await insert_task(sessions, tenant="acme")
        await client.post(f"/v1/tasks/{task_id}/cancel", headers=a)
        await send_until_settled(settings)
        assert len(check_signed(rec_a, sub_a["secret"])) == 1
        assert rec_b.received == [], "bolt's webhook hears nothing of acme's task"
        assert_error(await client.get(f"/v1/tasks/{task_id}/webhooks", headers=b), 404, "not_found")
        assert (await client.get(f"/v1/tasks/{task_id}/webhooks", headers=a)).status_code == 200


async def test_rotation_signs_later_deliveries_with_the_new_secret_only(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings)
    async with receiver() as rec, serve(create_app(settings)) as client:
        sub = await subscribe(client, rec.url(), ["task.finished"])
        rotated = await client.post(f"/v1/webhooks/{sub['id']}/rotate")
        assert rotated.status_code == 200, rotated.text
        new = rotated.json()
        assert new["id"] == sub["id"]
        assert new["secret"] != sub["secret"]
        assert new["rotated_at"]
        task_id = await insert_task(sessions)
        await client.post(f"/v1/tasks/{task_id}/cancel")
        await send_until_settled(settings)
        [got] = rec.received
        assert verify(new["secret"], got.headers["sandhive-signature"], got.body)
        assert not verify(sub["secret"], got.headers["sandhive-signature"], got.body)


async def test_a_deleted_webhook_gets_nothing_more(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings)
    async with receiver() as rec, serve(create_app(settings)) as client:
        sub = await subscribe(client, rec.url(), ["task.finished"])
        task_id = await insert_task(sessions)
        await client.post(f"/v1/tasks/{task_id}/cancel")  # queued in the outbox
        assert (await client.delete(f"/v1/webhooks/{sub['id']}")).status_code == 204
        assert_error(await client.delete(f"/v1/webhooks/{sub['id']}"), 404, "not_found")
        await send_until_settled(settings)
        assert rec.received == []
        [log] = (await client.get(f"/v1/tasks/{task_id}/webhooks")).json()["deliveries"]
        assert log["status"] == "dropped"
        other = await insert_task(sessions)
        await client.post(f"/v1/tasks/{other}/cancel")
        assert (await client.get(f"/v1/tasks/{other}/webhooks")).json()["deliveries"] == []


async def test_two_senders_at_once_send_each_delivery_once(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings, webhook_batch=2)
    async with receiver() as rec, serve(create_app(settings)) as client:
        await subscribe(client, rec.url(), ["task.finished"])
        task_ids = [await insert_task(sessions) for _ in range(7)]
        for task_id in task_ids:
            await client.post(f"/v1/tasks/{task_id}/cancel")
        async with open_resources(settings) as one, open_resources(settings) as two:
            await asyncio.gather(send_due(one.sessions, settings), send_due(two.sessions, settings))
        ids = sorted(json.loads(got.body)["data"]["id"] for got in rec.received)
        assert ids == sorted(task_ids), "every delivery once: claims skip locked rows"


async def test_a_sender_that_dies_after_claiming_leaves_the_delivery_to_another(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings, webhook_lease_s=0.3)
    async with receiver() as rec, serve(create_app(settings)) as client:
        sub = await subscribe(client, rec.url(), ["task.finished"])
        task_id = await insert_task(sessions)
        await client.post(f"/v1/tasks/{task_id}/cancel")
        async with open_resources(settings) as res:
            [claimed] = await webhook_delivery.claim_due(res.sessions, settings)  # then "dies"
            assert await send_due(res.sessions, settings) == 0, "leased: not sent twice at once"
            await asyncio.sleep(0.4)
            assert await send_due(res.sessions, settings) == 1, "the lease lapsed"
            await webhook_delivery.send(res.sessions, settings, claimed)  # the stale one wakes
        bodies = check_signed(rec, sub["secret"])
        assert len(bodies) == 2, "at least once: the stale sender's POST went out too"
        assert {b["id"] for b in bodies} == {bodies[0]["id"]}, "one event id to de-duplicate on"
        [log] = (await client.get(f"/v1/tasks/{task_id}/webhooks")).json()["deliveries"]
        assert log["status"] == "delivered"
        assert [(a["attempt"], a["status_code"]) for a in log["attempts"]] == [(1, 200), (2, 200)]


def test_the_verifier_in_the_docs_accepts_our_signatures_only() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "calling-services.md").read_text()
    snippet = re.search(r"### Verify the signature.*?```python\n(import base64.*?)```", page, re.S)
    assert snippet is not None
    namespace: dict[str, Any] = {}
    exec(snippet.group(1), namespace)  # our own docs page
    docs_verify = namespace["verify"]
    body = b'{"id":"evt_1","type":"task.finished"}'
    now = int(time.time())
    a, b = webhooks_service.new_secret(), webhooks_service.new_secret()

    def signed(secret: str, at: int) -> dict[str, str]:
        return webhook_delivery.signature_headers((secret,), "evt_1", body, at)

    assert docs_verify(a, signed(a, now), body)
    assert not docs_verify(b, signed(a, now), body)
    assert not docs_verify(a, signed(a, now), body + b" ")
    assert not docs_verify(a, signed(a, now - 3600), body)
    assert not docs_verify(a, {**signed(a, now), "webhook-id": "evt_2"}, body)
    both = webhook_delivery.signature_headers((b, a), "evt_1", body, now)  # an overlap
    assert docs_verify(a, both, body)
    assert docs_verify(b, both, body)


# A task's or an experiment's own webhook (`webhook: {url, events}` at submission)


async def submit_task(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    created = await client.post("/v1/tasks", json={"prompt": "work", **fields})
    assert created.status_code == 202, created.text
    return dict(created.json())


async def test_a_task_with_its_own_webhook_gets_a_signed_task_finished_at_its_url(
    make_settings: Callable[..., Settings],
) -> None:
    settings = allowing(make_settings)
    async with receiver() as tenants, receiver() as own, serve(create_app(settings)) as client:
        old = await subscribe(client, tenants.url(), ["task.started"])
        sub = await subscribe(client, tenants.url(path="/newest"), ["task.started"])
        task = await submit_task(client, webhook={"url": own.url(path="/mine")})
        expected = {
            "url": own.url(path="/mine"),
            "events": ["task.finished"],
            "signed_by": sub["id"],
        }
        assert task["webhook"] == expected, "the default event; the newest subscription signs"
        assert (await client.get(f"/v1/tasks/{task['id']}")).json()["webhook"] == expected
        assert (await client.post(f"/v1/tasks/{task['id']}/cancel")).status_code == 202
        await send_until_settled(settings)
        assert tenants.received == [], "the subscriptions want only task.started"
        [got] = own.received
        assert got.path == "/mine"
        [body] = check_signed(own, sub["secret"])
        assert not verify(old["secret"], got.headers["sandhive-signature"], got.body)
        assert body["type"] == "task.finished"
        assert body["data"] == (await client.get(f"/v1/tasks/{task['id']}")).json()
        [log] = (await client.get(f"/v1/tasks/{task['id']}/webhooks")).json()["deliveries"]
        assert (log["type"], log["url"], log["subscription_id"], log["status"]) == (
            "task.finished",
            own.url(path="/mine"),
            sub["id"],
            "delivered",
        )
        assert log["event_id"] == body["id"]
        plain = await submit_task(client)
        assert plain["webhook"] is None


async def test_a_task_webhook_gets_only_its_events_and_rotation_and_deletion_apply(
    make_settings: Callable[..., Settings],
) -> None:
    settings = allowing(make_settings)
    async with receiver() as own, serve(create_app(settings)) as client:
        sub = await subscribe(client, "http://127.0.0.1:9/unused", ["experiment.finished"])
        started_only = await submit_task(
            client, webhook={"url": own.url(path="/started"), "events": ["task.started"]}
        )
        both = await submit_task(
            client,
            webhook={"url": own.url(path="/both"), "events": ["task.finished", "task.started"]},
        )
        assert both["webhook"]["events"] == ["task.finished", "task.started"]
        async with open_resources(settings) as res:
            started = await attempts.start_attempt(
                res.sessions, res.redis, both["id"], "w1", max_attempts=3
            )
        assert started is not None
        await client.post(f"/v1/tasks/{started_only['id']}/cancel")  # task.finished: not wanted
        rotated = (await client.post(f"/v1/webhooks/{sub['id']}/rotate")).json()
        await send_until_settled(settings)
        assert [got.path for got in own.received] == ["/both"]
        [body] = check_signed(own, rotated["secret"])  # the current secret signs
        assert (body["type"], body["data"]["id"]) == ("task.started", both["id"])
        log = (await client.get(f"/v1/tasks/{started_only['id']}/webhooks")).json()
        assert log["deliveries"] == []
        # The signing subscription deleted: the task's later events are dropped, not unsigned.
        later = await submit_task(client, webhook={"url": own.url(path="/later")})
        assert (await client.delete(f"/v1/webhooks/{sub['id']}")).status_code == 204
        await client.post(f"/v1/tasks/{later['id']}/cancel")
        await send_until_settled(settings)
        assert len(own.received) == 1
        log = (await client.get(f"/v1/tasks/{later['id']}/webhooks")).json()["deliveries"]
        assert [(d["type"], d["status"]) for d in log] == [("task.finished", "dropped")]
        refused = await client.post(
            "/v1/tasks", json={"prompt": "x", "webhook": {"url": own.url()}}
        )
        assert (
            "register a subscription first"
            in assert_error(refused, 422, "invalid_input")["message"]
        )


async def test_a_disallowed_task_webhook_is_a_422_with_nothing_stored(
    make_settings: Callable[..., Settings],
) -> None:
    async with serve(create_app(make_settings())) as client:
        public = {"url": "https://example.com/hook"}
        no_sub = await client.post("/v1/tasks", json={"prompt": "x", "webhook": public})
        error = assert_error(no_sub, 422, "invalid_input")
        assert "register a subscription first: POST /v1/webhooks" in error["message"]
        assert error["details"][0]["loc"] == ["body", "webhook"]
        await subscribe(client, "https://example.com/sub", ["task.finished"])
        for url in ("http://127.0.0.1:8080/hook", "http://localhost/h", "ftp://example.com/h"):
            refused = await client.post("/v1/tasks", json={"prompt": "x", "webhook": {"url": url}})
            error = assert_error(refused, 422, "invalid_input")
            assert error["details"][0]["loc"] == ["body", "webhook", "url"], error
        for webhook in (
            {"url": "https://example.com/h", "events": ["task.exploded"]},
            {"url": "https://example.com/h", "events": ["experiment.finished"]},
            {"url": "https://example.com/h", "events": []},
            {"url": "https://example.com/h", "secret": "mine"},
        ):
            refused = await client.post("/v1/tasks", json={"prompt": "x", "webhook": webhook})
            assert_error(refused, 422, "invalid_input")
        batch = await client.post(
            "/v1/tasks/batch",
            json={
                "tasks": [
                    {"prompt": "ok", "webhook": public},
                    {"prompt": "bad", "webhook": {"url": "http://10.0.0.1/h"}},
                ]
            },
        )
        error = assert_error(batch, 422, "invalid_input")
        assert error["details"][0]["loc"] == ["body", "tasks", 1, "webhook", "url"], error
        assert (await client.get("/v1/tasks")).json()["items"] == []
        bad_exp = await client.post(
            "/v1/experiments", json=experiment(webhook={"url": "http://192.168.1.1/h"})
        )
        error = assert_error(bad_exp, 422, "invalid_input")
        assert error["details"][0]["loc"] == ["body", "webhook", "url"], error
        arm_hook = experiment(arms=[{"name": "a", "task": {"webhook": public}}])
        assert_error(await client.post("/v1/experiments", json=arm_hook), 422, "invalid_input")
        assert (await client.get("/v1/experiments")).json()["experiments"] == []
        allowed = await client.post("/v1/tasks", json={"prompt": "x", "webhook": public})
        assert allowed.status_code == 202, allowed.text
    async with serve(create_app(allowing(make_settings))) as client:
        await submit_task(client, webhook={"url": "http://127.0.0.1:8080/hook"})


async def test_an_experiment_with_its_own_webhook_gets_experiment_finished(
    make_settings: Callable[..., Settings],
) -> None:
    settings = allowing(make_settings)
    async with receiver() as tenants, receiver() as own, serve(create_app(settings)) as client:
        sub = await subscribe(client, tenants.url(), ["task.started"])
        created = await client.post(
            "/v1/experiments", json=experiment(webhook={"url": own.url(path="/exp")})
        )
        assert created.status_code == 202, created.text
        exp = created.json()
        expected = {
            "url": own.url(path="/exp"),
            "events": ["experiment.finished"],
            "signed_by": sub["id"],
        }
        assert exp["webhook"] == expected
        url = f"/v1/experiments/{exp['id']}"
        assert (await client.get(url)).json()["webhook"] == expected
        assert (await client.post(f"{url}/cancel")).status_code == 202
        await send_until_settled(settings)
        assert tenants.received == []
        [body] = check_signed(own, sub["secret"])
        assert (body["type"], body["data"]["id"], body["data"]["status"]) == (
            "experiment.finished",
            exp["id"],
            "cancelled",
        )
        assert body["data"] == (await client.get(url)).json()
        [log] = (await client.get(f"{url}/webhooks")).json()["deliveries"]
        assert (log["type"], log["url"], log["status"], log["event_id"]) == (
            "experiment.finished",
            own.url(path="/exp"),
            "delivered",
            body["id"],
        )
        bad = await client.post(
            "/v1/experiments",
            json=experiment(webhook={"url": own.url(), "events": ["task.finished"]}),
        )
        assert_error(bad, 422, "invalid_input")


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/a\x01b",
        "https://example.com/a b",
        "https://exa mple.com/",
        "http://x\x7f/",
    ],
)
async def test_a_url_with_a_space_or_control_character_is_a_422(
    make_settings: Callable[..., Settings], url: str
) -> None:
    async with serve(create_app(allowing(make_settings))) as client:
        refused = await client.post("/v1/webhooks", json={"url": url, "events": ["task.finished"]})
        error = assert_error(refused, 422, "invalid_input")
        assert "not a valid URL" in error["message"]


async def test_a_delivery_to_a_url_httpx_refuses_fails_instead_of_blocking_the_queue(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    """A subscription stored before URLs were checked this closely: its delivery is
    recorded as failed, not left claimed and re-claimed first at every lease."""
    settings = allowing(make_settings)
    async with receiver() as rec, serve(create_app(settings)) as client:
        await subscribe(client, rec.url(), ["task.finished"])
        task_id = await insert_task(sessions)
        await client.post(f"/v1/tasks/{task_id}/cancel")
        async with sessions.begin() as session:
            delivery = await session.scalar(select(models.WebhookDelivery))
            assert delivery is not None
            delivery.url = rec.url() + "/a\x01b"
        async with open_resources(settings) as res:
            assert await send_due(res.sessions, settings) == 1
        [log] = (await client.get(f"/v1/tasks/{task_id}/webhooks")).json()["deliveries"]
        [attempt] = log["attempts"]
        assert "InvalidURL" in attempt["error"]
        assert log["status"] in ("pending", "failed")
        assert rec.received == []


async def test_concurrent_creates_stop_at_the_cap(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = allowing(make_settings, webhook_max_subscriptions=3)
    async with serve(create_app(settings)) as client:
        body = {"url": "http://127.0.0.1:9/hook", "events": ["task.finished"]}
        answers = await asyncio.gather(*(client.post("/v1/webhooks", json=body) for _ in range(12)))
    assert sorted(a.status_code for a in answers) == [201] * 3 + [422] * 9
    async with sessions() as session:
        count = await session.scalar(select(func.count()).select_from(models.WebhookSubscription))
    assert count == 3
