"""The client's webhook verifier accepts what the server's signer signs (the Standard Webhooks
headers and the deprecated `Sandhive-Signature`), and nothing else."""

from __future__ import annotations

import base64
import json
import time

import pytest
from sandhive_client import WebhookVerificationError, verify_webhook

from app.services.webhooks.delivery import sign as server_sign
from app.services.webhooks.delivery import signature_headers
from app.services.webhooks.service import new_secret

SECRET = "whsec_test_0123456789"
BODY = json.dumps({"id": "evt_1", "type": "task.finished", "data": {"id": "tsk_1"}}).encode()


def test_a_delivery_signed_by_the_server_verifies() -> None:
    now = int(time.time())
    header = server_sign(SECRET, BODY, now)
    assert verify_webhook(SECRET, header, BODY) == now
    assert verify_webhook(SECRET, header, BODY.decode()) == now  # the body as text too
    rotated = f"{header},v1={'0' * 64}"  # a second signature (a secret being rotated)
    assert verify_webhook(SECRET, rotated, BODY) == now


@pytest.mark.parametrize(
    ("secret", "body", "age_s"),
    [
        ("whsec_other", BODY, 0),  # another secret
        (SECRET, BODY.replace(b"tsk_1", b"tsk_2"), 0),  # a changed body
        (SECRET, BODY, 301),  # too old: a replay
        (SECRET, BODY, -301),  # from the future
    ],
)
def test_anything_else_is_refused(secret: str, body: bytes, age_s: int) -> None:
    now = int(time.time())
    header = server_sign(secret, BODY, now - age_s)
    with pytest.raises(WebhookVerificationError):
        verify_webhook(SECRET, header, body, tolerance_s=300)


@pytest.mark.parametrize("header", [None, "", "v1=abc", "t=1", "t=x,v1=abc", "garbage"])
def test_a_malformed_header_is_refused(header: str | None) -> None:
    with pytest.raises(WebhookVerificationError):
        verify_webhook(SECRET, header, BODY)


STANDARD = "whsec_" + base64.b64encode(bytes(range(32))).decode()  # fixed: the tests' ids
OTHER = "whsec_" + base64.b64encode(bytes(range(1, 33))).decode()


def test_the_standard_headers_verify_in_any_case_and_with_the_old_header_beside() -> None:
    now = int(time.time())
    headers = signature_headers((STANDARD,), "evt_1", BODY, now)
    assert set(headers) == {
        "Sandhive-Signature",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    }
    assert verify_webhook(STANDARD, headers, BODY) == now
    upper = {name.upper(): value for name, value in headers.items()}
    assert verify_webhook(STANDARD, upper, BODY) == now
    alone = {"Sandhive-Signature": headers["Sandhive-Signature"]}  # no standard headers
    assert verify_webhook(STANDARD, alone, BODY) == now


@pytest.mark.parametrize(
    ("secret", "body", "age_s", "event_id"),
    [
        (OTHER, BODY, 0, "evt_1"),  # another secret
        (STANDARD, BODY.replace(b"tsk_1", b"tsk_2"), 0, "evt_1"),  # a changed body
        (STANDARD, BODY, 301, "evt_1"),  # too old: a replay
        (STANDARD, BODY, 0, "evt_2"),  # another event's id
    ],
    ids=["another-secret", "a-changed-body", "a-replay", "another-id"],
)
def test_anything_else_under_the_standard_headers_is_refused(
    secret: str, body: bytes, age_s: int, event_id: str
) -> None:
    headers = signature_headers((secret,), "evt_1", BODY, int(time.time()) - age_s)
    with pytest.raises(WebhookVerificationError):
        verify_webhook(STANDARD, {**headers, "webhook-id": event_id}, body)


def test_the_server_makes_secrets_of_the_standard_form() -> None:
    secret = new_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret.removeprefix("whsec_"), validate=True)) == 32


def test_a_secret_of_the_older_form_says_to_rotate_it() -> None:
    headers = signature_headers((STANDARD,), "evt_1", BODY, int(time.time()))
    alone = {k: v for k, v in headers.items() if k != "Sandhive-Signature"}
    with pytest.raises(WebhookVerificationError, match="rotate it"):
        verify_webhook(SECRET, alone, BODY)
    with pytest.raises(WebhookVerificationError, match="does not match"):
        verify_webhook(SECRET, headers, BODY)  # the old header, not signed with it


def test_the_first_rotation_from_an_older_secret_verifies_on_either_during_the_overlap() -> None:
    """A subscription made before Standard Webhooks, rotated with an overlap: deliveries
    carry the standard signature (the new secret only: the old one has no standard key)
    and the old header with both. A receiver on either secret accepts them."""
    now = int(time.time())
    headers = signature_headers((STANDARD, SECRET), "evt_1", BODY, now)
    assert len(headers["webhook-signature"].split()) == 1
    assert verify_webhook(STANDARD, headers, BODY) == now
    assert verify_webhook(SECRET, headers, BODY) == now
