"""Streamed Messages API answers: Server-Sent Events put back together into one message.

Imported by `app.llm.anthropic`, which reads the SSE lines with `app.llm.sse`.
Text and thinking fragments are handed to the loop's `on_delta` as they arrive
("text" / "reasoning"); the assembled message has the same shape as a
non-streamed answer, so one parser reads both.
"""

from __future__ import annotations

import json
from typing import Any

from app.agent.types import DeltaCallback


class StreamError(Exception):
    """An `error` event, or a stream that ended before `message_stop`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class MessageAssembler:
    """Feeds on parsed events; `message` is complete once `done` is true."""

    def __init__(self, on_delta: DeltaCallback | None) -> None:
        self.on_delta = on_delta
        self.message: dict[str, Any] = {"content": [], "usage": {}}
        self.done = False
        self._json: dict[int, list[str]] = {}

    async def feed(self, data: dict[str, Any]) -> None:
        """Apply one event; raises StreamError for an `error` event."""
        kind = data.get("type")
        if kind == "message_start":
            self.message = {**data["message"], "content": []}
        elif kind == "content_block_start":
            self._blocks().append(dict(data["content_block"]))
        elif kind == "content_block_delta":
            await self._delta(int(data["index"]), data["delta"])
        elif kind == "content_block_stop":
            self._close_block(int(data["index"]))
        elif kind == "message_delta":
            self.message.update(data.get("delta") or {})
            self.message.setdefault("usage", {}).update(data.get("usage") or {})
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            error = data.get("error") or {}
            raise StreamError(str(error.get("type", "error")), str(error.get("message", "")))

    def _blocks(self) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = self.message["content"]
        return blocks

    async def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self._blocks()[index]
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta["text"]
            await self._emit("text", delta["text"])
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta["thinking"]
            await self._emit("reasoning", delta["thinking"])
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + delta["signature"]
        elif kind == "input_json_delta":
            self._json.setdefault(index, []).append(delta.get("partial_json", ""))

    def _close_block(self, index: int) -> None:
        """A tool_use block's input arrives as JSON text in pieces: decode it at the end."""
        if index in self._json:
            text = "".join(self._json.pop(index))
            self._blocks()[index]["input"] = json.loads(text) if text.strip() else {}

    async def _emit(self, kind: str, fragment: str) -> None:
        if self.on_delta is not None and fragment:
            await self.on_delta(kind, fragment)
