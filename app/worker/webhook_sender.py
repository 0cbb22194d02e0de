"""The worker's webhook chore: send what the outbox has due, a batch at a time."""

from __future__ import annotations

import asyncio

from app.config import Settings
from app.db.engine import Sessions
from app.services.webhooks import delivery as webhook_delivery


async def send_due(sessions: Sessions, settings: Settings) -> int:
    """Claim and send the due deliveries (concurrently, each bounded in time); how many."""
    total = 0
    while True:
        claimed = await webhook_delivery.claim_due(sessions, settings)
        if not claimed:
            return total
        await asyncio.gather(*(webhook_delivery.send(sessions, settings, c) for c in claimed))
        total += len(claimed)
        if len(claimed) < settings.webhook_batch:
            return total
