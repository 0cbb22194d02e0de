"""Verify a Sandhive webhook: `Sandhive-Signature: t=<unix s>,v1=<hex HMAC-SHA256>`.

The MAC is over `"<t>.<raw body>"` under the subscription's secret, so check the
raw bytes as received (before any JSON parsing). The timestamp bounds replays.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from sandhive_client.errors import WebhookVerificationError

SIGNATURE_HEADER = "Sandhive-Signature"


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The header value Sandhive sends for `body` at `timestamp` (for tests of receivers)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify_webhook(
    secret: str,
    header: str | None,
    body: bytes | str,
    tolerance_s: float = 300,
    *,
    now: float | None = None,
) -> int:
    """The delivery's timestamp if `header` signs `body` under `secret` within `tolerance_s`
    of now; WebhookVerificationError otherwise. Several `v1=` (a rotation) pass if one does."""
    if not header:
        raise WebhookVerificationError(f"no {SIGNATURE_HEADER} header")
    raw = body.encode() if isinstance(body, str) else body
    timestamp: int | None = None
    signatures: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t":
            try:
                timestamp = int(value)
            except ValueError:
                raise WebhookVerificationError("the signature's t= is not a number") from None
        elif name == "v1":
            signatures.append(value)
    if timestamp is None or not signatures:
        raise WebhookVerificationError("the signature header needs t= and v1=")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise WebhookVerificationError(f"the signature is older than {tolerance_s} s (a replay?)")
    expected = sign(secret, raw, timestamp).partition(",v1=")[2]
    if not any(hmac.compare_digest(expected, candidate) for candidate in signatures):
        raise WebhookVerificationError("the signature does not match the body and secret")
    return timestamp
