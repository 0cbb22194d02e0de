"""Verify a Sandhive webhook, signed the Standard Webhooks way or the deprecated Sandhive way.

Standard Webhooks (what Sandhive sends now, and what the `standardwebhooks` and `svix`
libraries verify): `webhook-id`, `webhook-timestamp` and `webhook-signature: v1,<base64>`,
an HMAC-SHA256 of `"<id>.<timestamp>.<raw body>"` keyed with the base64 bytes after the
secret's `whsec_`; several space-separated signatures during a rotation's overlap.

Deprecated, sent alongside for one release: `Sandhive-Signature: t=<unix s>,v1=<hex>`, an
HMAC-SHA256 of `"<t>.<raw body>"` keyed with the whole secret text.

Check the raw bytes as received (before any JSON parsing). The timestamp bounds replays.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping

from sandhive_client.errors import WebhookVerificationError

SIGNATURE_HEADER = "Sandhive-Signature"
SECRET_PREFIX = "whsec_"


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The deprecated header value Sandhive sends for `body` at `timestamp` (for tests of
    receivers)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify_webhook(
    secret: str,
    header: str | Mapping[str, str] | None,
    body: bytes | str,
    tolerance_s: float = 300,
    *,
    now: float | None = None,
) -> int:
    """The delivery's timestamp if it is signed under `secret` within `tolerance_s` of now;
    WebhookVerificationError otherwise.

    `header`: the request's headers (any mapping, names in any case): the Standard Webhooks
    headers are checked when present, else `Sandhive-Signature`; or that header's value
    alone (the deprecated way). Several signatures (a rotation) pass if one does."""
    raw = body.encode() if isinstance(body, str) else body
    current = time.time() if now is None else now
    if isinstance(header, Mapping):
        headers = {name.lower(): value for name, value in header.items()}
        deprecated = headers.get(SIGNATURE_HEADER.lower())
        if "webhook-signature" in headers and (_standard_key(secret) or deprecated is None):
            return _standard(secret, headers, raw, tolerance_s, current)
        # A secret of the older form (a subscription made before Standard Webhooks, during
        # the overlap of its first rotation) is checked against the header it signs.
        header = deprecated
    return _deprecated(secret, header, raw, tolerance_s, current)


def _standard_key(secret: str) -> bytes | None:
    """The HMAC key of a Standard Webhooks secret; None for one of the older form."""
    try:
        return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        return None


def _standard(
    secret: str, headers: Mapping[str, str], raw: bytes, tolerance_s: float, now: float
) -> int:
    message_id, stamp = headers.get("webhook-id"), headers.get("webhook-timestamp")
    if not message_id or not stamp:
        raise WebhookVerificationError("webhook-signature needs webhook-id and webhook-timestamp")
    timestamp = _stamp(stamp, now, tolerance_s)
    key = _standard_key(secret)
    if key is None:
        raise WebhookVerificationError(
            "this secret predates Standard Webhooks secrets: rotate it "
            "(POST /v1/webhooks/{id}/rotate), or verify the Sandhive-Signature header"
        )
    mac = hmac.new(key, f"{message_id}.{timestamp}.".encode() + raw, hashlib.sha256)
    expected = base64.b64encode(mac.digest()).decode()
    candidates = [
        value
        for version, _, value in (s.partition(",") for s in headers["webhook-signature"].split())
        if version == "v1"
    ]
    if not any(hmac.compare_digest(expected, candidate) for candidate in candidates):
        raise WebhookVerificationError("the signature does not match the body and secret")
    return timestamp


def _deprecated(secret: str, header: str | None, raw: bytes, tolerance_s: float, now: float) -> int:
    if not header:
        raise WebhookVerificationError(f"no webhook-signature or {SIGNATURE_HEADER} header")
    stamp: str | None = None
    signatures: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t":
            stamp = value
        elif name == "v1":
            signatures.append(value)
    if stamp is None or not signatures:
        raise WebhookVerificationError("the signature header needs t= and v1=")
    timestamp = _stamp(stamp, now, tolerance_s)
    expected = sign(secret, raw, timestamp).partition(",v1=")[2]
    if not any(hmac.compare_digest(expected, candidate) for candidate in signatures):
        raise WebhookVerificationError("the signature does not match the body and secret")
    return timestamp


def _stamp(value: str, now: float, tolerance_s: float) -> int:
    try:
        timestamp = int(value)
    except ValueError:
        raise WebhookVerificationError("the signature's timestamp is not a number") from None
    if abs(now - timestamp) > tolerance_s:
        raise WebhookVerificationError(f"the signature is older than {tolerance_s} s (a replay?)")
    return timestamp
