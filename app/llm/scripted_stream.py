"""The scripted LLM's streamed answers: one chat.completion cut into SSE chunks.

Used by `app.llm.scripted` when a request says `"stream": true`. The cut is the
one real servers make: a role chunk, reasoning and content each in several
deltas, every tool call announced (id, name) and then its arguments in pieces,
a finish chunk, the usage chunk when `stream_options.include_usage` asks for
it, and `data: [DONE]`. Working from the finished completion keeps the
streamed and the plain answers of a turn identical by construction.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import StreamingResponse

PIECES = 3


def streaming_response(
    completion: Mapping[str, Any], body: Mapping[str, Any], delay_s: float = 0.0
) -> StreamingResponse:
    """The completion as `text/event-stream`, pausing `delay_s` between chunks."""
    options = body.get("stream_options")
    usage = isinstance(options, Mapping) and options.get("include_usage") is True
    chunks = completion_chunks(completion, include_usage=usage)
    return StreamingResponse(_events(chunks, delay_s), media_type="text/event-stream")


async def _events(chunks: list[dict[str, Any]], delay_s: float) -> AsyncIterator[str]:
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n"
        if delay_s > 0:
            await asyncio.sleep(delay_s)
    yield "data: [DONE]\n\n"


def completion_chunks(
    completion: Mapping[str, Any], *, include_usage: bool
) -> list[dict[str, Any]]:
    """Every chat.completion.chunk of this completion, in order."""
    choice = completion["choices"][0]
    message = choice["message"]
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{"reasoning_content": part} for part in pieces(message.get("reasoning_content"))]
    deltas += [{"content": part} for part in pieces(message.get("content"))]
    for index, call in enumerate(message.get("tool_calls") or ()):
        deltas += [{"tool_calls": [part]} for part in tool_call_parts(index, call)]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": completion.get("id", "chatcmpl-scripted"),
            "object": "chat.completion.chunk",
            "created": completion.get("created", 0),
            "model": completion.get("model", ""),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    chunks = [chunk(delta) for delta in deltas]
    chunks.append(chunk({}, choice.get("finish_reason") or "stop"))
    if include_usage:
        chunks.append({**chunk({}), "choices": [], "usage": completion.get("usage")})
    return chunks


def tool_call_parts(index: int, call: Any) -> list[dict[str, Any]]:
    """A tool call as stream fragments: announced with its name, then arguments in pieces."""
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("arguments"), str):
        return [{"index": index, **(dict(call) if isinstance(call, Mapping) else {})}]
    head = {
        "index": index,
        "id": call.get("id"),
        "type": call.get("type", "function"),
        "function": {"name": function.get("name"), "arguments": ""},
    }
    rest = [
        {"index": index, "function": {"arguments": part}} for part in pieces(function["arguments"])
    ]
    return [head, *rest]


def pieces(text: Any, count: int = PIECES) -> list[str]:
    """`text` cut into up to `count` non-empty parts (none for empty or missing text)."""
    if not isinstance(text, str) or not text:
        return []
    size = -(-len(text) // count)
    return [text[start : start + size] for start in range(0, len(text), size)]
