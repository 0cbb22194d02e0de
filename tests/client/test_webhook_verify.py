"""The client's webhook verifier accepts what the server's signer signs, and nothing else."""

from __future__ import annotations

import json
import time

import pytest
from sandhive_client import WebhookVerificationError, verify_webhook

from app.services.webhooks.delivery import sign as server_sign

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
