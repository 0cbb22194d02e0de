"""The worker's ear for the egress proxy: each refusal it reports becomes a task event.

`DockerHost.egress_gate.on_blocked` is a plain callback (the sandbox layer knows nothing
of Postgres); this turns it into background writes through `services.network_events`.
One writer per attempt stores its refusals in the order the proxy reported them (each
write in its own transaction would commit, and number, in whatever order they won the
race); refusals reported while a write is in flight go into the next one together.
A sandbox can provoke refusals as fast as it can open sockets, so each attempt stores at
most `MAX_EVENTS_PER_ATTEMPT` of them; the metric counts them all.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from redis.asyncio import Redis

from app.db.engine import Sessions
from app.services.tasks.network_events import record_blocked

MAX_EVENTS_PER_ATTEMPT = 200
log = logging.getLogger(__name__)

Attempt = tuple[str, int]
"""(task id, attempt)"""


class BlockedRecorder:
    """Callable as `app.sandbox.egress_proxy.BlockedHook`."""

    def __init__(self, sessions: Sessions, redis: Redis) -> None:
        self._sessions, self._redis = sessions, redis
        self._stored: Counter[Attempt] = Counter()
        self._queued: dict[Attempt, list[tuple[str, str]]] = {}
        self._writers: dict[Attempt, asyncio.Task[None]] = {}

    def __call__(self, task_id: str, attempt: int, host: str, reason: str) -> None:
        key = (task_id, attempt)
        if self._stored[key] >= MAX_EVENTS_PER_ATTEMPT:
            return
        self._stored[key] += 1
        self._queued.setdefault(key, []).append((host, reason))
        if key not in self._writers:
            self._writers[key] = asyncio.create_task(self._write(key))

    async def _write(self, key: Attempt) -> None:
        """Store what is queued for `key`, batch after batch, until nothing is."""
        task_id, attempt = key
        try:
            while refusals := self._queued.pop(key, None):
                try:
                    stored = await record_blocked(
                        self._sessions, self._redis, task_id, attempt, refusals
                    )
                except Exception as exc:  # Postgres down: the refusals stand, their record is lost
                    log.warning("network.blocked of %s not stored: %r", task_id, exc)
                    continue
                if not stored:  # that attempt is over: forget it
                    self._stored.pop(key, None)
                    self._queued.pop(key, None)
                    return
        finally:
            del self._writers[key]

    async def drain(self) -> None:
        """Wait for the writes in flight (tests, shutdown)."""
        while self._writers:
            await asyncio.gather(*list(self._writers.values()), return_exceptions=True)
