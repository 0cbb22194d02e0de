"""Webhook subscriptions, and the outbox hook every state change calls.

`enqueue` runs inside the transaction that changes a task or an experiment:
the delivery rows commit with the change or not at all, so an API or worker
crash between the change and the POST loses nothing (the sender,
`services.webhook_delivery`, picks them up later). A tenant without a matching
subscription costs one indexed query and builds no payload.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.db import models
from app.db.engine import Sessions, db_now
from app.domain.resolve import Loc, problem
from app.errors import Conflict, InvalidInput, NotFound
from app.ids import utc_now
from app.schemas.webhooks import (
    AttemptOut,
    DeliveryList,
    DeliveryOut,
    WebhookCreate,
    WebhookList,
    WebhookOut,
    WebhookWithSecret,
)
from app.services.visibility import find_task
from app.services.webhooks.net import Allow, check_url
from app.specs import WebhookSpec

Sub = models.WebhookSubscription
Delivery = models.WebhookDelivery


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def new_secret() -> str:
    """`whsec_` + base64 of 32 random bytes: the Standard Webhooks form (its libraries
    base64-decode what follows `whsec_` into the HMAC key)."""
    return f"whsec_{base64.b64encode(secrets.token_bytes(32)).decode()}"


async def create(
    sessions: Sessions, settings: Settings, tenant: str, body: WebhookCreate
) -> WebhookWithSecret:
    check_url(body.url, Allow.of(settings.webhook_allowed_hosts))
    async with sessions.begin() as session:
        # One creator per tenant at a time, until commit: two at once would both count
        # below the cap and both add one.
        lock = func.pg_advisory_xact_lock(func.hashtextextended(f"webhooks:{tenant}", 0))
        await session.execute(select(lock))
        count = await session.scalar(
            select(func.count()).select_from(Sub).where(Sub.tenant_id == tenant)
        )
        if (count or 0) >= settings.webhook_max_subscriptions:
            raise InvalidInput(
                f"at most {settings.webhook_max_subscriptions} webhooks per tenant",
                {"field": "url"},
            )
        sub = Sub(
            id=_id("wh"),
            tenant_id=tenant,
            url=body.url,
            events=sorted(set(body.events)),
            secret=new_secret(),
            created_at=utc_now(),
        )
        session.add(sub)
    return WebhookWithSecret(**_out(sub).model_dump(), secret=sub.secret)


async def list_subscriptions(sessions: Sessions, tenant: str) -> WebhookList:
    async with sessions() as session:
        subs = await session.scalars(
            select(Sub).where(Sub.tenant_id == tenant).order_by(Sub.created_at, Sub.id)
        )
        return WebhookList(webhooks=[_out(sub) for sub in subs])


async def delete(sessions: Sessions, tenant: str, webhook_id: str) -> None:
    """Its pending deliveries are dropped by the sender (their subscription is gone)."""
    async with sessions.begin() as session:
        await session.delete(await _find(session, tenant, webhook_id))


async def rotate(
    sessions: Sessions, tenant: str, webhook_id: str, overlap_s: int = 0
) -> WebhookWithSecret:
    """A new secret at once: later attempts, retries included, are signed with it, and for
    `overlap_s` seconds with the old one too (on Postgres's clock, the senders')."""
    async with sessions.begin() as session:
        sub = await _find(session, tenant, webhook_id, lock=True)
        now = await db_now(session)
        sub.previous_secret = sub.secret if overlap_s > 0 else None
        sub.previous_until = now + timedelta(seconds=overlap_s) if overlap_s > 0 else None
        sub.secret = new_secret()
        sub.rotated_at = utc_now()
    return WebhookWithSecret(**_out(sub).model_dump(), secret=sub.secret)


async def _find(
    session: AsyncSession, tenant: str, webhook_id: str, *, lock: bool = False
) -> models.WebhookSubscription:
    query = select(Sub).where(Sub.id == webhook_id, Sub.tenant_id == tenant)
    sub = await session.scalar(query.with_for_update() if lock else query)
    if sub is None:  # another tenant's is just as missing
        raise NotFound(f"webhook {webhook_id} not found")
    return sub


def _out(sub: models.WebhookSubscription) -> WebhookOut:
    return WebhookOut.model_validate(
        {
            "id": sub.id,
            "url": sub.url,
            "events": sub.events,
            "created_at": sub.created_at,
            "rotated_at": sub.rotated_at,
            "previous_secret_until": _still(sub.previous_until),
        }
    )


def _still(until: datetime | None) -> datetime | None:
    """`until` while it is ahead, else None."""
    return until if until is not None and until > utc_now() else None


NO_SUBSCRIPTION = "register a subscription first: POST /v1/webhooks"


async def own_webhook(
    sessions: Sessions, settings: Settings, tenant: str, url: str, events: list[str], loc: Loc
) -> WebhookSpec:
    """A task's or an experiment's own webhook, checked like a subscription and pinned to
    the subscription that signs it (the tenant's newest): 422 at `loc` otherwise.

    Signed with a subscription's secret rather than one of its own, so receivers verify one
    secret per tenant, rotation covers every URL at once, and no secret lives in a spec.
    """
    try:
        check_url(url, Allow.of(settings.webhook_allowed_hosts))
    except InvalidInput as exc:
        raise InvalidInput(
            f"{'.'.join(map(str, loc))}.url: {exc.message}",
            [problem((*loc, "url"), exc.message, "url_not_allowed")],
        ) from None
    async with sessions() as session:
        signer = await session.scalar(
            select(Sub.id)
            .where(Sub.tenant_id == tenant)
            .order_by(Sub.created_at.desc(), Sub.id.desc())
            .limit(1)
        )
    if signer is None:
        raise InvalidInput(
            f"{'.'.join(map(str, loc))}: {NO_SUBSCRIPTION}",
            [problem(loc, NO_SUBSCRIPTION, "no_subscription")],
        )
    return WebhookSpec(url=url, events=sorted(set(events)), signed_by=signer)


async def wanted(session: AsyncSession, tenant: str, event_type: str) -> bool:
    """Whether any of the tenant's subscriptions wants this event type."""
    query = select(Sub.id).where(Sub.tenant_id == tenant, Sub.events.contains([event_type]))
    return (await session.scalar(query.limit(1))) is not None


async def enqueue(
    session: AsyncSession,
    tenant: str,
    event_type: str,
    data: Callable[[], Any],
    *,
    task_id: str | None = None,
    experiment_id: str | None = None,
    own: WebhookSpec | None = None,
) -> int:
    """Write the event's deliveries in the caller's transaction; how many.

    `data` builds the object as its GET returns it (JSON-able), only when some
    subscription, or the object's `own` webhook, wants the event. The own webhook's
    delivery names its signing subscription, so the sender signs (or, once that
    subscription is deleted, drops) it as it does the subscription's own.
    """
    targets = [
        (sub.id, sub.url)
        for sub in await session.scalars(
            select(Sub).where(Sub.tenant_id == tenant, Sub.events.contains([event_type]))
        )
    ]
    if own is not None and own.signed_by is not None and event_type in own.events:
        targets.append((own.signed_by, own.url))
    if not targets:
        return 0
    now = await db_now(session)  # the senders compare its due time on Postgres's clock
    event_id = _id("evt")
    body = json.dumps(
        {"id": event_id, "type": event_type, "created_at": now.isoformat(), "data": data()},
        separators=(",", ":"),
    )
    for subscription_id, url in targets:
        session.add(
            _pending(
                now,
                event_id=event_id,
                event_type=event_type,
                tenant_id=tenant,
                subscription_id=subscription_id,
                url=url,
                task_id=task_id,
                experiment_id=experiment_id,
                body=body,
            )
        )
    return len(targets)


def _pending(now: datetime, **event: Any) -> models.WebhookDelivery:
    """A new delivery of `event` (its id, type, body and where it goes), due at once."""
    return Delivery(
        id=_id("whd"),
        status="pending",
        attempts=0,
        log=[],
        next_attempt_at=now,
        created_at=now,
        **event,
    )


async def task_deliveries(sessions: Sessions, tenant: str, task_id: str) -> DeliveryList:
    """A task's delivery log, oldest first (404 for another tenant's task)."""
    async with sessions() as session:
        await find_task(session, tenant, task_id)
        rows = await session.scalars(
            select(Delivery)
            .where(Delivery.task_id == task_id, Delivery.tenant_id == tenant)
            .order_by(Delivery.created_at, Delivery.id)
        )
        return DeliveryList(deliveries=[delivery_out(row) for row in rows])


async def experiment_deliveries(
    sessions: Sessions, tenant: str, experiment_id: str
) -> DeliveryList:
    """An experiment's delivery log, oldest first (404 for another tenant's experiment)."""
    async with sessions() as session:
        exp = await session.scalar(
            select(models.Experiment.id).where(
                models.Experiment.id == experiment_id, models.Experiment.tenant_id == tenant
            )
        )
        if exp is None:
            raise NotFound(f"experiment {experiment_id} not found")
        rows = await session.scalars(
            select(Delivery)
            .where(Delivery.experiment_id == experiment_id, Delivery.tenant_id == tenant)
            .order_by(Delivery.created_at, Delivery.id)
        )
        return DeliveryList(deliveries=[delivery_out(row) for row in rows])


async def subscription_deliveries(
    sessions: Sessions, tenant: str, webhook_id: str, limit: int
) -> DeliveryList:
    """A subscription's `limit` newest deliveries, newest first: the one log that also
    holds events of no task or experiment (`episode.closed`)."""
    async with sessions() as session:
        await _find(session, tenant, webhook_id)
        rows = await session.scalars(
            select(Delivery)
            .where(Delivery.subscription_id == webhook_id, Delivery.tenant_id == tenant)
            .order_by(Delivery.created_at.desc(), Delivery.id.desc())
            .limit(limit)
        )
        return DeliveryList(deliveries=[delivery_out(row) for row in rows])


async def redeliver(sessions: Sessions, tenant: str, delivery_id: str) -> DeliveryOut:
    """The same event (its id and body, byte for byte) sent again as a new delivery to the
    same URL, whatever became of the first: for a receiver that lost or mishandled it.
    404 for another tenant's delivery, 409 when its subscription was deleted."""
    async with sessions.begin() as session:
        first = await session.scalar(
            select(Delivery).where(Delivery.id == delivery_id, Delivery.tenant_id == tenant)
        )
        if first is None:
            raise NotFound(f"delivery {delivery_id} not found")
        if await session.get(Sub, first.subscription_id) is None:
            raise Conflict(f"the webhook of delivery {delivery_id} was deleted")
        again = _pending(
            await db_now(session),
            event_id=first.event_id,
            event_type=first.event_type,
            tenant_id=tenant,
            subscription_id=first.subscription_id,
            url=first.url,
            task_id=first.task_id,
            experiment_id=first.experiment_id,
            body=first.body,
        )
        session.add(again)
    return delivery_out(again)


def delivery_out(row: models.WebhookDelivery) -> DeliveryOut:
    return DeliveryOut.model_validate(
        {
            "id": row.id,
            "event_id": row.event_id,
            "type": row.event_type,
            "subscription_id": row.subscription_id,
            "url": row.url,
            "status": row.status,
            "attempts": [AttemptOut.model_validate(entry) for entry in row.log],
            "next_attempt_at": row.next_attempt_at if row.status == "pending" else None,
            "created_at": row.created_at,
            "delivered_at": row.delivered_at,
        }
    )
