"""What a worker knows about each task it runs: its queue message, its lease, why it must stop.

Shared by the pool (which fills it) and the attempt (which obeys it); no I/O.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from app.bus.queue import Claim

if TYPE_CHECKING:
    from app.sandbox.docker import DockerSandbox


class StopReason(StrEnum):
    cancel = "cancel"
    """The client cancelled the task: stop, keep the output so far, end `cancelled`."""
    hand_back = "hand_back"
    """The worker is shutting down: stop and queue the task again, no attempt lost."""
    lease_lost = "lease_lost"
    """Another worker took the task over: stop and write nothing more."""


class End(StrEnum):
    """How the worker is done with a message."""

    done = "done"
    """The task is terminal (or was already): ack the message."""
    hand_back = "hand_back"
    """The task is queued again: enqueue it anew, ack this message."""
    retry = "retry"
    """Could not even start (e.g. Postgres down): enqueue it anew after a pause."""
    stale = "stale"
    """A newer attempt owns the task: touch neither its lease nor its message."""


@dataclass
class Running:
    """One task this worker holds the lease of."""

    claim: Claim
    holder: str
    attempt: int | None = None
    reason: StopReason | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    sandbox: DockerSandbox | None = None
    """The attempt's sandbox while it runs (`hold`): what the file service reaches."""

    @property
    def task_id(self) -> str:
        return self.claim.task_id

    def hold(self, sandbox: DockerSandbox | None) -> None:
        """The episode's hook: its sandbox is ready (or None: about to be removed)."""
        self.sandbox = sandbox

    def request_stop(self, reason: StopReason) -> None:
        """The first reason wins: a cancel stays a cancel even if shutdown follows."""
        if self.reason is None:
            self.reason = reason
            self.stop.set()
