"""Sending the outbox: claim due deliveries, sign, POST, record each attempt.

At-least-once: a delivery stays `pending` until a 2xx is recorded, so a sender
that dies mid-POST leaves it to be sent again once its lease lapses (receivers
de-duplicate on the event `id`). Claims use FOR UPDATE SKIP LOCKED, so many
workers share the outbox without sending one delivery twice at a time.
Retries back off exponentially with jitter until `webhook_retry_for_s` after
the event, then the delivery is `failed`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from sqlalchemy import or_, select

from app.config import Settings
from app.db import models
from app.db.engine import Sessions, db_now
from app.services.webhooks.net import Allow, Refused, answers, post

log = logging.getLogger(__name__)
Delivery = models.WebhookDelivery
SIGNATURE_HEADER = "Sandhive-Signature"
"""Deprecated: Sandhive's own signature, sent beside the Standard Webhooks headers for one
release (docs/calling-services.md)."""
SECRET_PREFIX = "whsec_"


@dataclass(frozen=True)
class Claimed:
    id: str
    url: str
    body: str
    secrets: tuple[str, ...]
    """The subscription's current secret, then the one a rotation replaced while it still
    signs (`overlap_s`); empty once the subscription was deleted."""
    event_id: str
    event_type: str
    attempts: int
    created_at: datetime


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The deprecated `Sandhive-Signature` value: `t=<unix s>,v1=<hex HMAC-SHA256("<t>.<body>")>`,
    keyed with the whole secret text."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def standard_key(secret: str) -> bytes | None:
    """The HMAC key of a Standard Webhooks secret (`whsec_` + base64); None for a secret
    made before Sandhive used that form (`whsec_` + URL-safe text), which its libraries
    cannot read: such a subscription gets the standard headers once its secret is rotated."""
    try:
        return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        return None


def standard_signature(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """One `webhook-signature` entry: `v1,` + base64 HMAC-SHA256 of `<id>.<timestamp>.<body>`."""
    mac = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return f"v1,{base64.b64encode(mac.digest()).decode()}"


def signature_headers(
    secrets: tuple[str, ...], event_id: str, body: bytes, timestamp: int
) -> dict[str, str]:
    """The Standard Webhooks headers (`webhook-id`, `webhook-timestamp`, `webhook-signature`
    with one signature per secret, space-separated) and the deprecated `Sandhive-Signature`
    (one `v1=` per secret)."""
    legacy = [sign(secret, body, timestamp).partition(",")[2] for secret in secrets]
    headers = {SIGNATURE_HEADER: ",".join([f"t={timestamp}", *legacy])}
    keys = [key for key in map(standard_key, secrets) if key is not None]
    if keys:
        headers["webhook-id"] = event_id
        headers["webhook-timestamp"] = str(timestamp)
        headers["webhook-signature"] = " ".join(
            standard_signature(key, event_id, timestamp, body) for key in keys
        )
    return headers


def _overlapping(sub: models.WebhookSubscription, now: datetime) -> bool:
    """Whether the secret its last rotation replaced still signs."""
    return sub.previous_until is not None and sub.previous_until > now


async def claim_due(sessions: Sessions, settings: Settings) -> list[Claimed]:
    """Up to `webhook_batch` due deliveries, leased to this sender."""
    async with sessions.begin() as session:
        now = await db_now(session)  # every sender's leases and due times on one clock
        rows = list(
            await session.scalars(
                select(Delivery)
                .where(
                    Delivery.status == "pending",
                    Delivery.next_attempt_at <= now,
                    or_(Delivery.lease_until.is_(None), Delivery.lease_until < now),
                )
                .order_by(Delivery.next_attempt_at)
                .limit(settings.webhook_batch)
                .with_for_update(skip_locked=True)
            )
        )
        if not rows:
            return []
        lease = now + timedelta(seconds=settings.webhook_lease_s)
        for row in rows:
            row.lease_until = lease
        subs = {
            sub.id: (sub.secret,)
            + ((sub.previous_secret,) if _overlapping(sub, now) and sub.previous_secret else ())
            for sub in await session.scalars(
                select(models.WebhookSubscription).where(
                    models.WebhookSubscription.id.in_({row.subscription_id for row in rows})
                )
            )
        }
    return [
        Claimed(
            id=row.id,
            url=row.url,
            body=row.body,
            secrets=subs.get(row.subscription_id, ()),
            event_id=row.event_id,
            event_type=row.event_type,
            attempts=row.attempts,
            created_at=row.created_at,
        )
        for row in rows
    ]


async def send(sessions: Sessions, settings: Settings, claimed: Claimed) -> None:
    """One attempt of a claimed delivery, recorded (a vanished subscription drops it)."""
    if not claimed.secrets:
        await _record(sessions, settings, claimed, None, "its webhook was deleted", drop=True)
        return
    body = claimed.body.encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Sandhive-Webhooks/1",
        **signature_headers(claimed.secrets, claimed.event_id, body, int(time.time())),
        "Sandhive-Event-Id": claimed.event_id,
        "Sandhive-Event-Type": claimed.event_type,
    }
    code: int | None = None
    error: str | None = None
    try:
        code = await post(
            claimed.url,
            body,
            headers,
            Allow.of(settings.webhook_allowed_hosts),
            hosts=answers(settings.webhook_hosts),
            timeout_s=settings.webhook_timeout_s,
            max_response_bytes=settings.webhook_max_response_bytes,
        )
        if not 200 <= code < 300:
            error = f"HTTP {code}" + (" (redirects are not followed)" if 300 <= code < 400 else "")
    except Refused as exc:
        error = f"refused: {exc}"
    except TimeoutError:
        error = f"no response within {settings.webhook_timeout_s:g} s"
    except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as exc:
        # InvalidURL is no HTTPError: uncaught, it would leave the delivery claimed and
        # unrecorded, claimed again first at every lease, before every other tenant's.
        error = f"{type(exc).__name__}: {exc}"[:500]
    await _record(sessions, settings, claimed, code, error)


def _next(
    settings: Settings,
    claimed: Claimed,
    attempt: int,
    now: datetime,
    error: str | None,
    *,
    drop: bool,
) -> tuple[str, datetime | None]:
    """The delivery's status after this attempt, and when to try again (None: never)."""
    if error is None:
        return "delivered", None
    if drop:
        return "dropped", None
    delay = min(
        settings.webhook_retry_base_s * 2 ** (attempt - 1), settings.webhook_retry_max_delay_s
    ) * random.uniform(0.5, 1.0)
    next_at = now + timedelta(seconds=delay)
    give_up = claimed.created_at + timedelta(seconds=settings.webhook_retry_for_s)
    return ("pending", next_at) if next_at <= give_up else ("failed", None)


async def _record(
    sessions: Sessions,
    settings: Settings,
    claimed: Claimed,
    code: int | None,
    error: str | None,
    *,
    drop: bool = False,
) -> None:
    """Log the attempt; change the delivery's state only if no other sender has since
    (the attempt count seen at claim time fences it). Times on Postgres's clock, as the
    claims that compare them."""
    attempt = claimed.attempts + 1
    async with sessions.begin() as session:
        now = await db_now(session)
        status, next_at = _next(settings, claimed, attempt, now, error, drop=drop)
        entry = {
            "attempt": attempt,
            "at": now.isoformat(),
            "status_code": code,
            "error": error,
            "next_retry_at": next_at.isoformat() if next_at else None,
        }
        row = await session.scalar(
            select(Delivery).where(Delivery.id == claimed.id).with_for_update()
        )
        if row is None:
            return
        entry["attempt"] = len(row.log) + 1
        if row.attempts != claimed.attempts or row.status != "pending":
            # A stale sender (its lease lapsed, another took the delivery over): its POST is
            # logged, the state is the current holder's to change.
            row.log = [*row.log, {**entry, "next_retry_at": None}]
            return
        row.attempts = attempt
        row.log = [*row.log, entry]
        row.status = status
        row.lease_until = None
        if next_at is not None:
            row.next_attempt_at = next_at
        if status == "delivered":
            row.delivered_at = now
    if error is not None:
        log.info("webhook %s attempt %d: %s (%s)", claimed.id, attempt, error, status)
