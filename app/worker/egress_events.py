"""The worker's ear for the egress proxy: each refusal it reports becomes a task event.

`DockerHost.egress_gate.on_blocked` is a plain callback (the sandbox layer knows nothing
of Postgres); this turns it into a background write through `services.network_events`.
A sandbox can provoke refusals as fast as it can open sockets, so each attempt stores at
most `MAX_EVENTS_PER_ATTEMPT` of them; the metric counts them all.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from redis.asyncio import Redis

from app.db.engine import Sessions
from app.services.network_events import record_blocked

MAX_EVENTS_PER_ATTEMPT = 200
log = logging.getLogger(__name__)


class BlockedRecorder:
    """Callable as `app.sandbox.egress_proxy.BlockedHook`."""

    def __init__(self, sessions: Sessions, redis: Redis) -> None:
        self._sessions, self._redis = sessions, redis
        self._stored: Counter[tuple[str, int]] = Counter()
        self._pending: set[asyncio.Task[None]] = set()

    def __call__(self, task_id: str, attempt: int, host: str, reason: str) -> None:
        key = (task_id, attempt)
        if self._stored[key] >= MAX_EVENTS_PER_ATTEMPT:
            return
        self._stored[key] += 1
        write = asyncio.create_task(self._record(task_id, attempt, host, reason))
        self._pending.add(write)
        write.add_done_callback(self._pending.discard)

    async def _record(self, task_id: str, attempt: int, host: str, reason: str) -> None:
        try:
            if not await record_blocked(
                self._sessions, self._redis, task_id, attempt, host, reason
            ):
                self._stored.pop((task_id, attempt), None)  # that attempt is over
        except Exception as exc:  # Postgres down: the refusal itself stands, its record is lost
            log.warning("network.blocked of %s not stored: %r", task_id, exc)

    async def drain(self) -> None:
        """Wait for the writes in flight (tests, shutdown)."""
        await asyncio.gather(*list(self._pending), return_exceptions=True)
