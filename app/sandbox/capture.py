"""Bounded capture of one output stream of a command: the head and the tail survive.

Pure; used by `app.sandbox.docker`. A command that prints gigabytes (`yes`)
must not grow the worker: past the cap the middle is dropped, which keeps what
the reference-style truncation (first and last lines) shows to the model.
"""

from __future__ import annotations

from collections import deque


class OutputCapture:
    """Keeps the first cap/2 and the last cap/2 bytes of a stream."""

    def __init__(self, cap: int) -> None:
        self._half = max(cap // 2, 1)
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_len = 0
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self._half - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self._tail.append(chunk)
        self._tail_len += len(chunk)
        while self._tail_len - len(self._tail[0]) >= self._half:
            dropped = len(self._tail.popleft())
            self._tail_len -= dropped
            self.dropped += dropped
        if self._tail_len > self._half:  # trim the oldest piece to the cap
            excess = self._tail_len - self._half
            self._tail[0] = self._tail[0][excess:]
            self._tail_len -= excess
            self.dropped += excess

    def value(self) -> bytes:
        """Everything, or head + a one-line marker + tail when bytes were dropped."""
        tail = b"".join(self._tail)
        if not self.dropped:
            return bytes(self._head) + tail
        marker = f"\n[... {self.dropped} bytes of output dropped ...]\n".encode()
        return bytes(self._head) + marker + tail
