"""`experiment.finished`: the webhook event an experiment's end writes to the outbox.

Called inside the transaction that ends the experiment (the runner's finish, a cancel); the
payload is the experiment as `GET /v1/experiments/{id}` returns it.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.db import models
from app.services.experiments.outs import experiment_outs
from app.services.webhooks import service as webhooks
from app.specs import WebhookSpec


async def experiment_finished(session: AsyncSession, exp: models.Experiment) -> None:
    """`experiment.finished` (its status says `finished` or `cancelled`)."""
    own_spec = exp.spec.get("webhook")
    own = WebhookSpec.model_validate(own_spec) if own_spec else None
    if own is None and not await webhooks.wanted(session, exp.tenant_id, "experiment.finished"):
        return
    (out,) = await experiment_outs(session, [exp])
    await webhooks.enqueue(
        session,
        exp.tenant_id,
        "experiment.finished",
        lambda: out.model_dump(mode="json"),
        experiment_id=exp.id,
        own=own,
    )
