"""Resuming a task's event stream by seq: what both clients' `stream` share.

Durable events have a gapless `seq`; reconnecting with Last-Event-ID = the last
one seen makes the server replay exactly what came after, and any event at or
below it (a replay overlap) is dropped here, so none is lost or repeated.
"""

from __future__ import annotations

import time

from sandhive_client import errors
from sandhive_client._sse import Frame
from sandhive_client.models import Event

FIRST_WAIT_S = 0.2
LONGEST_WAIT_S = 5.0


class Resume:
    def __init__(self, task_id: str, after: int, reconnect_for_s: float) -> None:
        self.task_id = task_id
        self.last = after
        self.reconnect_for_s = reconnect_for_s
        self._broken_since: float | None = None
        self._wait = FIRST_WAIT_S

    def headers(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, "Accept": "text/event-stream", "Last-Event-ID": str(self.last)}

    def accept(self, frame: Frame) -> Event | None:
        """The frame's event, or None for one already seen."""
        event = Event.model_validate_json(frame.data)
        if event.seq is not None:
            if event.seq <= self.last:
                return None
            self.last = event.seq
        self._broken_since, self._wait = None, FIRST_WAIT_S
        return event

    def pause(self, cause: Exception | None, longest_s: float) -> float:
        """Seconds to wait before reconnecting (Retry-After if the server said);
        ConnectionFailed once the stream has been down for `reconnect_for_s`."""
        now = time.monotonic()
        if self._broken_since is None:
            self._broken_since = now
        if now - self._broken_since > self.reconnect_for_s:
            raise errors.ConnectionFailed(
                f"the stream of {self.task_id} broke and did not resume in "
                f"{self.reconnect_for_s} s (last seq {self.last})"
            ) from cause
        told = cause.retry_after_s if isinstance(cause, errors.RetryableError) else None
        wait = told if told is not None else self._wait
        self._wait = min(self._wait * 2, LONGEST_WAIT_S)
        return min(wait, longest_s)
