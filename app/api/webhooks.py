"""`/v1/webhooks` (subscriptions: create, list, delete, rotate the secret) and the delivery
logs, `GET /v1/tasks/{id}/webhooks` and `GET /v1/experiments/{id}/webhooks`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response, status

from app.api.deps import Res, Tenant
from app.schemas.tasks import ErrorOut
from app.schemas.webhooks import (
    DeliveryList,
    DeliveryOut,
    RotateIn,
    WebhookCreate,
    WebhookList,
    WebhookWithSecret,
)
from app.services.webhooks import service as webhooks

DEFAULT_DELIVERIES = 50
MAX_DELIVERIES = 200
router = APIRouter(tags=["webhooks"])
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorOut} for code in (401, 404, 422)}


@router.post(
    "/v1/webhooks",
    status_code=status.HTTP_201_CREATED,
    response_model=WebhookWithSecret,
    responses=_ERRORS,
)
async def create_webhook(body: WebhookCreate, res: Res, tenant: Tenant) -> WebhookWithSecret:
    """Subscribe a URL to events; the answer holds its signing `secret`, shown only here."""
    return await webhooks.create(res.sessions, res.settings, tenant, body)


@router.get("/v1/webhooks", response_model=WebhookList, responses=_ERRORS)
async def list_webhooks(res: Res, tenant: Tenant) -> WebhookList:
    """The tenant's subscriptions (without their secrets)."""
    return await webhooks.list_subscriptions(res.sessions, tenant)


@router.delete(
    "/v1/webhooks/{webhook_id}", status_code=status.HTTP_204_NO_CONTENT, responses=_ERRORS
)
async def delete_webhook(webhook_id: str, res: Res, tenant: Tenant) -> Response:
    """Unsubscribe; deliveries not yet sent are dropped."""
    await webhooks.delete(res.sessions, tenant, webhook_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/v1/webhooks/{webhook_id}/rotate", response_model=WebhookWithSecret, responses=_ERRORS
)
async def rotate_webhook(
    webhook_id: str, res: Res, tenant: Tenant, body: RotateIn | None = None
) -> WebhookWithSecret:
    """A new signing secret, effective at once. The old one stops signing at once, or signs
    beside it for `overlap_s` seconds (`webhook-signature` then carries both)."""
    overlap = body.overlap_s if body is not None else 0
    return await webhooks.rotate(res.sessions, tenant, webhook_id, overlap)


@router.get("/v1/webhooks/{webhook_id}/deliveries", response_model=DeliveryList, responses=_ERRORS)
async def subscription_deliveries(
    webhook_id: str,
    res: Res,
    tenant: Tenant,
    limit: Annotated[int, Query(ge=1, le=MAX_DELIVERIES)] = DEFAULT_DELIVERIES,
) -> DeliveryList:
    """The subscription's newest deliveries, newest first, each with every attempt (also
    those of events of no task or experiment, such as `episode.closed`)."""
    return await webhooks.subscription_deliveries(res.sessions, tenant, webhook_id, limit)


@router.post(
    "/v1/webhooks/deliveries/{delivery_id}/redeliver",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=DeliveryOut,
    responses={409: {"model": ErrorOut, "description": "Its webhook was deleted"}, **_ERRORS},
)
async def redeliver(delivery_id: str, res: Res, tenant: Tenant) -> DeliveryOut:
    """Send a past delivery's event again (the same `id` and body) as a new delivery to the
    same URL, signed afresh: for a receiver that lost or mishandled it."""
    return await webhooks.redeliver(res.sessions, tenant, delivery_id)


@router.get("/v1/tasks/{task_id}/webhooks", response_model=DeliveryList, responses=_ERRORS)
async def task_webhooks(task_id: str, res: Res, tenant: Tenant) -> DeliveryList:
    """Every delivery of the task's events, each with every attempt and its next retry."""
    return await webhooks.task_deliveries(res.sessions, tenant, task_id)


@router.get(
    "/v1/experiments/{experiment_id}/webhooks", response_model=DeliveryList, responses=_ERRORS
)
async def experiment_webhooks(experiment_id: str, res: Res, tenant: Tenant) -> DeliveryList:
    """Every delivery of the experiment's events, each with every attempt and its next retry."""
    return await webhooks.experiment_deliveries(res.sessions, tenant, experiment_id)
