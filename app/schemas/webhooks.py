"""The wire models of webhooks: subscriptions and their delivery log."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BeforeValidator, ConfigDict, Field

from app.schemas.tasks import WireModel

EventType = Literal[
    "task.started",
    "task.expiring",
    "task.finished",
    "experiment.finished",
    "episode.closed",
    "sandbox.created",
    "sandbox.expiring",
    "sandbox.ended",
]
EVENT_TYPES: tuple[EventType, ...] = (
    "task.started",
    "task.expiring",
    "task.finished",
    "experiment.finished",
    "episode.closed",
    "sandbox.created",
    "sandbox.expiring",
    "sandbox.ended",
)


class WebhookCreate(WireModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    url: str = Field(max_length=2000)
    """The http(s) URL that receives the POSTs: a public address, unless the operator allows
    it (`SANDHIVE_WEBHOOK_ALLOWED_HOSTS`)."""
    events: list[EventType] = Field(min_length=1, max_length=len(EVENT_TYPES))
    """Which events to send it."""


class WebhookOut(WireModel):
    id: str
    """`wh_...`."""
    url: str
    """Where the events are POSTed."""
    events: list[EventType]
    """The event types it receives."""
    created_at: datetime
    """When it was registered."""
    rotated_at: datetime | None = None
    """When its secret was last rotated."""
    previous_secret_until: datetime | None = None
    """Until when the secret the last rotation replaced still signs beside the new one
    (`webhook-signature` then carries both); null when it no longer does."""


class WebhookWithSecret(WebhookOut):
    secret: str
    """Signs every delivery: `whsec_` and the base64 of 32 random bytes, the Standard
    Webhooks form that its libraries take as it is (`webhook-signature`, and the deprecated
    `Sandhive-Signature`); shown only in this answer."""


def _whole(value: object) -> object:
    """A number with no fractional part as the integer it is (JSON Schema's `integer`
    admits `5303.0`); anything else as given, for the strict check to judge."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


class RotateIn(WireModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    overlap_s: Annotated[int, BeforeValidator(_whole)] = Field(default=0, ge=0, le=7 * 24 * 3600)
    """For how many seconds the old secret keeps signing beside the new one, so receivers
    can switch without refusing a delivery (0, the default: it stops at once, as after a
    leak). At most 7 days."""


class WebhookList(WireModel):
    webhooks: list[WebhookOut]
    """The tenant's subscriptions, oldest first."""


class AttemptOut(WireModel):
    attempt: int
    """1 for the first POST."""
    at: datetime
    """When it was made."""
    status_code: int | None = None
    """The receiver's answer; null when none came (refused, timeout, connection error)."""
    error: str | None = None
    """Why it did not count as delivered; null on a 2xx."""
    next_retry_at: datetime | None = None
    """When the next attempt is due; null once delivered or given up."""


class DeliveryOut(WireModel):
    id: str
    """`whd_...`: this event for this subscription."""
    event_id: str
    """The event's `id` (the body's), the same on every retry: de-duplicate on it."""
    type: str
    """The event type."""
    subscription_id: str
    """The subscription it goes to (it may since have been deleted)."""
    url: str
    """The URL it goes to."""
    status: Literal["pending", "delivered", "failed", "dropped"]
    """`pending` (retrying), `delivered`, `failed` (gave up) or `dropped` (subscription gone)."""
    attempts: list[AttemptOut]
    """Every attempt, oldest first."""
    next_attempt_at: datetime | None
    """While pending: when it is next sent."""
    created_at: datetime
    """When the event happened (for a redelivery: when it was asked for)."""
    delivered_at: datetime | None = None
    """When a 2xx came."""


class DeliveryList(WireModel):
    deliveries: list[DeliveryOut]
    """The task's deliveries, oldest first."""
