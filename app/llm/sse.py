"""Streamed chat completions: an OpenAI-style SSE answer read into an ordinary completion.

Used by `app.llm.openai` when it asks for `"stream": true`. Each SSE `data:`
event is a `chat.completion.chunk`: content and reasoning fragments go to
`on_delta` as they arrive, tool-call fragments are joined by their index, and
the usage chunk (asked for with `stream_options.include_usage`) fills in the
token counts. The result is the `chat.completion` JSON a non-streamed request
would have returned, so one parser serves both paths.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing, suppress
from dataclasses import dataclass, field
from typing import Any

import httpx

from app.agent.types import DeltaCallback

DONE = "[DONE]"
AFTER_DONE_MAX_CHARS = 64 * 2**10
AFTER_DONE_TIMEOUT_S = 1.0
REFUSAL = re.compile(r"\b(stream_options|stream)\b")
LINE_END = re.compile(r"\r\n|\r|\n")
"""What ends an SSE line, and nothing else (the spec: CRLF, LF or CR)."""
REASONING_KEYS = ("reasoning_content", "reasoning")


class StreamError(ValueError):
    """The stream was not a well-formed sequence of chat.completion.chunk events."""


def streaming_body(body: Mapping[str, Any], *, include_usage: bool = True) -> dict[str, Any]:
    """The request body asking for a stream (and, unless refused before, the usage chunk)."""
    streamed = {**body, "stream": True}
    if include_usage:
        streamed["stream_options"] = {"include_usage": True}
    return streamed


def is_event_stream(response: httpx.Response) -> bool:
    """False when a server ignored `stream` and answered with plain JSON."""
    content_type: str = response.headers.get("content-type", "")
    return content_type.startswith("text/event-stream")


def refused_option(response: httpx.Response) -> str | None:
    """ "stream_options" or "stream" when a 400/422 answer names it; a server that cannot stream."""
    if response.status_code not in (400, 422):
        return None
    found = REFUSAL.search(response.text)
    return found.group(1) if found else None


async def read_completion(response: httpx.Response, on_delta: DeltaCallback) -> dict[str, Any]:
    """Consume a streamed answer, reporting fragments; the equivalent chat.completion JSON."""
    assembler = ChunkAssembler()
    lines = sse_lines(response.aiter_text())
    async with aclosing(sse_data(lines)) as events:
        async for data in events:
            if data.strip() == DONE:
                break
            try:
                chunk = json.loads(data)
            except ValueError as exc:
                raise StreamError(f"an event is not JSON: {data[:200]!r}") from exc
            if not isinstance(chunk, dict):
                raise StreamError(f"an event is not an object: {data[:200]!r}")
            if chunk.get("error"):
                raise StreamError(f"the server reported an error mid-stream: {chunk['error']}")
            for kind, fragment in assembler.feed(chunk):
                await on_delta(kind, fragment)
    await _read_to_end(lines)
    return assembler.completion()


async def _read_to_end(lines: AsyncIterator[str]) -> None:
    """Read what follows `[DONE]` (nothing, from any server seen) to the response's end.

    A response left unread is closed with its connection, so every step would open a new
    one (a TCP and, to a provider, a TLS handshake); read to its end, the connection goes
    back to the client's pool. The answer is whole by now, so nothing here may fail or slow
    it: a server that sends more than AFTER_DONE_MAX_CHARS, keeps the stream open longer
    than AFTER_DONE_TIMEOUT_S or breaks it just loses its connection, as before.
    """
    left = AFTER_DONE_MAX_CHARS
    with suppress(httpx.HTTPError, TimeoutError):
        async with asyncio.timeout(AFTER_DONE_TIMEOUT_S):
            async for line in lines:
                left -= len(line) + 1
                if left < 0:
                    return


async def sse_lines(chunks: AsyncIterator[str]) -> AsyncGenerator[str, None]:
    """The stream's lines, ended only where the SSE spec ends them.

    Not httpx's `aiter_lines()`: that splits like `str.splitlines`, also at U+2028, U+2029,
    U+0085 and form feeds, which servers leave raw inside JSON strings (JSON allows them).
    A model that writes one would break its own event in two and end the step as an
    `llm_error`, an infrastructure failure a trainer masks out: a way to make a bad
    rollout disappear.
    """
    pending = ""
    async for chunk in chunks:
        text = pending + chunk
        held = text.endswith("\r")  # a CRLF may be cut between two chunks
        *lines, pending = LINE_END.split(text[:-1] if held else text)
        pending += "\r" if held else ""
        for line in lines:
            yield line
    *lines, last = LINE_END.split(pending)
    for line in [*lines, last] if last else lines:
        yield line


async def sse_data(lines: AsyncIterator[str]) -> AsyncGenerator[str, None]:
    """The data of each SSE event (multi-line data joined by newlines); comments skipped."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


@dataclass
class _CallParts:
    id: str = ""
    type: str = "function"
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class ChunkAssembler:
    """Accumulates chunk deltas into one assistant message."""

    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    reasoning_key: str = "reasoning_content"
    calls: dict[int, _CallParts] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None
    """Capture (`app.llm.capture`): vLLM sends the prompt's ids on the first chunk."""
    token_ids: list[int] | None = None
    """Capture: each chunk's choice carries the ids of the tokens it adds."""
    logprobs: list[Any] | None = None
    """Capture: each chunk's `logprobs.content` entries, joined."""

    def feed(self, chunk: Mapping[str, Any]) -> list[tuple[str, str]]:
        """Take one chunk; the ("text" | "reasoning", fragment) pairs it carried."""
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        fragments: list[tuple[str, str]] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            self._take_capture(chunk, choice)
            delta = choice.get("delta")
            if isinstance(delta, dict):
                fragments.extend(self._take(delta))
        return fragments

    def _take_capture(self, chunk: Mapping[str, Any], choice: Mapping[str, Any]) -> None:
        """Token ids and logprobs of a captured call (absent from ordinary streams)."""
        prompt = chunk.get("prompt_token_ids") or choice.get("prompt_token_ids")
        if isinstance(prompt, list) and self.prompt_token_ids is None:
            self.prompt_token_ids = list(prompt)
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            self.token_ids = self.token_ids or []
            self.token_ids.extend(ids)
        logprobs = choice.get("logprobs")
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        if isinstance(content, list):
            self.logprobs = self.logprobs or []
            self.logprobs.extend(content)

    def _take(self, delta: Mapping[str, Any]) -> list[tuple[str, str]]:
        fragments: list[tuple[str, str]] = []
        text = _text(delta.get("content"))
        if text:
            self.content.append(text)
            fragments.append(("text", text))
        for key in REASONING_KEYS:
            thought = delta.get(key)
            if isinstance(thought, str) and thought:
                self.reasoning_key = key
                self.reasoning.append(thought)
                fragments.append(("reasoning", thought))
                break
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                self._add_call(call)
        return fragments

    def _add_call(self, call: Mapping[str, Any]) -> None:
        """One tool-call fragment: the first names it, later ones extend its arguments."""
        index = call.get("index")
        if not isinstance(index, int):
            index = self._index_of(str(call.get("id") or ""))
        parts = self.calls.setdefault(index, _CallParts())
        parts.id = str(call.get("id") or parts.id)
        parts.type = str(call.get("type") or parts.type)
        function = call.get("function") or {}
        name = function.get("name")
        if isinstance(name, str) and name and name != parts.name:
            parts.name += name  # some servers split a name; none repeat a different one
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # a whole object in one piece (Ollama)
            parts.arguments = [json.dumps(arguments)]
        elif isinstance(arguments, str):
            parts.arguments.append(arguments)

    def _index_of(self, call_id: str) -> int:
        """For servers that send no index: the call with this id, a new one, or the latest."""
        if not call_id:
            return max(self.calls, default=0)
        found = [i for i, parts in self.calls.items() if parts.id == call_id]
        return found[0] if found else len(self.calls)

    def completion(self) -> dict[str, Any]:
        """The chat.completion JSON these chunks add up to."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.content) if self.content else None,
        }
        if self.reasoning:
            message[self.reasoning_key] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": parts.id,
                    "type": parts.type,
                    "function": {"name": parts.name, "arguments": "".join(parts.arguments)},
                }
                for _, parts in sorted(self.calls.items())
            ]
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": self.finish_reason,
        }
        if self.token_ids is not None:
            choice["token_ids"] = self.token_ids
        if self.logprobs is not None:
            choice["logprobs"] = {"content": self.logprobs}
        data: dict[str, Any] = {"object": "chat.completion", "choices": [choice]}
        data["usage"] = self.usage or {}
        if self.prompt_token_ids is not None:
            data["prompt_token_ids"] = self.prompt_token_ids
        return data


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(str(p.get("text", "")) for p in value if isinstance(p, dict))
    return ""
