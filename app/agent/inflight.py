"""The step in progress, as far as a viewer has seen it live: kept so a cut step is stored.

A step announced with `step.started` must end with a durable `step.completed`,
even when the run is cut in the middle of it (a cancel, the task's timeout, a
model or sandbox failure): otherwise what viewers saw live (the model's text,
the command and its output) would be missing from the trajectory. The loop
opens the step here before it awaits anything for it, tees the live callbacks
through it, and closes it once the step was reported; `cut` turns whatever is
open into an interrupted step.
"""

from __future__ import annotations

import time

from app.agent.live import MAX_LIVE_CHARS
from app.agent.truncate import cap_bytes, clean, truncate_lines
from app.agent.types import DeltaCallback, OutputCallback, Step
from app.ids import utc_now

KEEP_BYTES = 256 * 2**10
"""Per stream, bytes of a cut command's output kept from its start and from its end."""


class _Capture:
    """A stream's bytes in bounded memory: its head, and a rolling tail once the head is full."""

    def __init__(self, keep: int = KEEP_BYTES) -> None:
        self._keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self._keep - len(self.head)
        self.head += chunk[:room]
        self.tail += chunk[room:] if room > 0 else chunk
        if len(self.tail) > self._keep:
            self.dropped += len(self.tail) - self._keep
            del self.tail[: len(self.tail) - self._keep]

    def text(self) -> str:
        gap = f"\n[{self.dropped} bytes not kept]\n".encode() if self.dropped else b""
        return cap_bytes(truncate_lines(clean(bytes(self.head + gap + self.tail))))


class InFlight:
    """The one step the loop is in; None between a step's report and the next one's start."""

    def __init__(self) -> None:
        self.step: Step | None = None
        self._text: dict[str, list[str]] = {}
        self._chars = 0
        self._output: dict[str, _Capture] = {}
        self._started = 0.0
        self._tool_started: float | None = None

    def open(self, index: int) -> Step:
        self.step = Step(index=index, started_at=utc_now())
        self._text, self._chars, self._output = {}, 0, {}
        self._started, self._tool_started = time.monotonic(), None
        return self.step

    def close(self) -> None:
        self.step = None

    def tee_delta(self, forward: DeltaCallback) -> DeltaCallback:
        """`forward`, and keep the model's text as it streams (bounded like live events)."""

        async def on_delta(kind: str, fragment: str) -> None:
            if self._chars < MAX_LIVE_CHARS:
                self._text.setdefault(kind, []).append(fragment[: MAX_LIVE_CHARS - self._chars])
                self._chars += len(fragment)
            await forward(kind, fragment)

        return on_delta

    def tee_output(self, forward: OutputCallback) -> OutputCallback:
        """`forward`, and keep what the command printed so far (bounded)."""
        self._tool_started = time.monotonic()

        async def on_output(stream: str, chunk: bytes) -> None:
            self._output.setdefault(stream, _Capture()).add(chunk)
            await forward(stream, chunk)

        return on_output

    def cut(self, reason: str) -> Step | None:
        """The open step, marked `interrupted` with what was seen of it; None if none is open."""
        step, self.step = self.step, None
        if step is None:
            return None
        step.interrupted = reason
        now = time.monotonic()
        if step.action is None:  # still the model's turn: its text so far is the thought
            step.llm_ms = step.llm_ms or int((now - self._started) * 1000)
            step.thought = step.thought or "".join(self._text.get("text", []))
            step.reasoning = step.reasoning or "".join(self._text.get("reasoning", []))
        elif self._tool_started is not None and not step.observation:
            step.tool_ms = int((now - self._tool_started) * 1000)
            step.observation = self._observation()
        return step

    def _observation(self) -> str:
        out = self._output.get("stdout")
        err = self._output.get("stderr")
        parts = [out.text() if out else ""]
        if err is not None:
            parts.append(f"[stderr]\n{err.text()}")
        return "\n".join(part for part in parts if part)
