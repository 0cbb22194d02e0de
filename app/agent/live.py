"""Live-only progress of a step: the model's text as it streams, a command's output as it runs.

Used by `app.agent.loop`. Fragments are coalesced (flushed every `FLUSH_S` or
at `FLUSH_CHARS`) and handed to `EventSink.live` by a background flusher, so
neither the model stream nor the command's output reader ever waits on the
sink, and a chatty command does not become thousands of tiny events. Output
bytes are decoded incrementally, so a multibyte character split across chunks
stays whole. A failing sink only loses live events (the contract lets them be
dropped), never the step. Leaving the context flushes what is left, so every
live event of a step is handed over before the step is reported complete.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from app.agent.types import DeltaCallback, EventSink, OutputCallback, ToolCall

FLUSH_S = 0.08
FLUSH_CHARS = 4096
MAX_LIVE_CHARS = 2**20
"""Per step and kind: beyond this, live text stops (the step's observation has the rest)."""
CLOSE_WAIT_S = 2.0
ANNOUNCE_MAX_CHARS = 64 * 1024
"""`tool.started` carries the arguments only up to this size (the step has them all)."""
TRUNCATED = "\n[live output truncated here; the step's observation has the rest]\n"

log = logging.getLogger(__name__)

Emit = Callable[[str, str], Awaitable[None]]


@asynccontextmanager
async def model_deltas(sink: EventSink, index: int) -> AsyncIterator[DeltaCallback]:
    """An `on_delta` for step `index` that becomes `llm.delta` events ("text"/"reasoning")."""

    async def emit(kind: str, text: str) -> None:
        await sink.live("llm.delta", {"index": index, kind: text})

    coalescer = Coalescer(emit)

    async def on_delta(kind: str, fragment: str) -> None:
        coalescer.push(kind, fragment)

    try:
        yield on_delta
    finally:
        await coalescer.aclose()


@asynccontextmanager
async def tool_call(sink: EventSink, index: int, call: ToolCall) -> AsyncIterator[OutputCallback]:
    """Announce the call as `tool.started`, then stream what it prints as `tool.output`."""
    announced: dict[str, object] = {"index": index, "tool": call.name, "arguments": call.arguments}
    if len(json.dumps(call.arguments, default=str)) > ANNOUNCE_MAX_CHARS:
        announced.update(arguments=None, truncated=True)
    try:
        await asyncio.wait_for(sink.live("tool.started", announced), CLOSE_WAIT_S)
    except Exception as exc:  # a live event may be lost; the call must still run
        log.warning("live event dropped: %s", exc)
    async with command_output(sink, index) as on_output:
        yield on_output


@asynccontextmanager
async def command_output(sink: EventSink, index: int) -> AsyncIterator[OutputCallback]:
    """An `on_output` for step `index` that becomes `tool.output` events, decoded as UTF-8."""

    async def emit(stream: str, text: str) -> None:
        await sink.live("tool.output", {"index": index, "stream": stream, "chunk": text})

    coalescer = Coalescer(emit)
    decoders: dict[str, codecs.IncrementalDecoder] = {}

    async def on_output(stream: str, chunk: bytes) -> None:
        if stream not in decoders:
            decoders[stream] = codecs.getincrementaldecoder("utf-8")(errors="replace")
        coalescer.push(stream, decoders[stream].decode(chunk))

    try:
        yield on_output
    finally:
        for stream, decoder in decoders.items():
            coalescer.push(stream, decoder.decode(b"", final=True))
        await coalescer.aclose()


class Coalescer:
    """Joins fragments per key (in arrival order) and emits them in few, ordered calls."""

    def __init__(
        self,
        emit: Emit,
        *,
        interval_s: float = FLUSH_S,
        max_chars: int = FLUSH_CHARS,
        budget: int = MAX_LIVE_CHARS,
    ) -> None:
        self._emit = emit
        self._interval_s = interval_s
        self._max_chars = max_chars
        self._budget = budget
        self._pending: list[list[str]] = []
        self._size = 0
        self._closed = False
        self._warned = False
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="live-coalescer")

    def push(self, key: str, text: str) -> None:
        """Queue a fragment; never waits."""
        if not text or self._closed or self._budget <= 0:
            return
        if len(text) >= self._budget:
            text = text[: self._budget] + TRUNCATED
        self._budget -= len(text)
        if self._pending and self._pending[-1][0] == key:
            self._pending[-1][1] += text
        else:
            self._pending.append([key, text])
        self._size += len(text)
        self._wake.set()

    async def aclose(self) -> None:
        """Flush what is pending and stop; gives up (dropping it) after CLOSE_WAIT_S."""
        self._closed = True
        self._wake.set()
        done, _ = await asyncio.wait([self._task], timeout=CLOSE_WAIT_S)
        if not done:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            await self._gather()
            batch, self._pending, self._size = self._pending, [], 0
            self._wake.clear()
            for key, text in batch:
                await self._send(key, text)
            if self._closed and not self._pending:
                return

    async def _gather(self) -> None:
        """Wait up to the flush interval for more, unless enough is pending or we are closing."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._interval_s
        while not self._closed and self._size < self._max_chars:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except TimeoutError:
                return

    async def _send(self, key: str, text: str) -> None:
        try:
            await self._emit(key, text)
        except Exception as exc:  # live events may be lost; the step must not be
            if not self._warned:
                log.warning("live events dropped: %s", exc)
                self._warned = True
