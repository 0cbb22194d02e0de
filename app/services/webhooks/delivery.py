"""Sending the outbox: claim due deliveries, sign, POST, record each attempt.

At-least-once: a delivery stays `pending` until a 2xx is recorded, so a sender
that dies mid-POST leaves it to be sent again once its lease lapses (receivers
de-duplicate on the event `id`). Claims use FOR UPDATE SKIP LOCKED, so many
workers share the outbox without sending one delivery twice at a time.
Retries back off exponentially with jitter until `webhook_retry_for_s` after
the event, then the delivery is `failed`.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Claimed:
    id: str
    url: str
    body: str
    secret: str | None
    """The subscription's current secret; None once it was deleted."""
    event_id: str
    event_type: str
    attempts: int
    created_at: datetime


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The `Sandhive-Signature` header value: `t=<unix s>,v1=<hex HMAC-SHA256("<t>.<body>")>`."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


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
            sub.id: sub.secret
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
            secret=subs.get(row.subscription_id),
            event_id=row.event_id,
            event_type=row.event_type,
            attempts=row.attempts,
            created_at=row.created_at,
        )
        for row in rows
    ]


async def send(sessions: Sessions, settings: Settings, claimed: Claimed) -> None:
    """One attempt of a claimed delivery, recorded (a vanished subscription drops it)."""
    if claimed.secret is None:
        await _record(sessions, settings, claimed, None, "its webhook was deleted", drop=True)
        return
    body = claimed.body.encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Sandhive-Webhooks/1",
        SIGNATURE_HEADER: sign(claimed.secret, body, int(time.time())),
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
