"""The scripted server's streamed answers, as Server-Sent Events in both wire formats.

OpenAI (`streaming_response`, for `app.scripted.openai` when a request says
`"stream": true`): one chat.completion cut into chunks the way real servers cut
it: a role chunk, reasoning and content each in several deltas, every tool call
announced (id, name) and then its arguments in pieces, a finish chunk, the
usage chunk when `stream_options.include_usage` asks for it, and `data: [DONE]`.
Anthropic (`stream_events`, for `app.scripted.anthropic`): message_start, ping,
each content block as start, deltas and stop, message_delta, message_stop.
Working from the finished answer keeps the streamed and the plain answers of a
turn identical by construction.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import StreamingResponse

from app.scripted.tokens import spread

PIECES = 3
"""Text, reasoning and tool arguments are streamed in about this many deltas each."""


def streaming_response(
    completion: Mapping[str, Any], body: Mapping[str, Any], delay_s: float = 0.0
) -> StreamingResponse:
    """The completion as `text/event-stream`, pausing `delay_s` between chunks."""
    options = body.get("stream_options")
    usage = isinstance(options, Mapping) and options.get("include_usage") is True
    chunks = completion_chunks(completion, include_usage=usage)
    spread(chunks, completion)
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


async def stream_events(message: dict[str, Any]) -> AsyncIterator[bytes]:
    """The message as the Messages API streams it: start, blocks as deltas, delta, stop."""
    start = {**message, "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 1}
    yield sse("message_start", {"type": "message_start", "message": start})
    yield sse("ping", {"type": "ping"})
    for index, block in enumerate(message["content"]):
        for event in block_events(index, block):
            yield event
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    usage = {"output_tokens": message["usage"]["output_tokens"]}
    yield sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
    yield sse("message_stop", {"type": "message_stop"})


def block_events(index: int, block: dict[str, Any]) -> list[bytes]:
    """content_block_start, its deltas, content_block_stop."""
    kind = block["type"]
    if kind == "text":
        empty: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"])]
    elif kind == "thinking":
        empty = {"type": "thinking", "thinking": ""}
        deltas = [{"type": "thinking_delta", "thinking": p} for p in pieces(block["thinking"])]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    else:
        empty = {**block, "input": {}}
        deltas = [
            {"type": "input_json_delta", "partial_json": p}
            for p in pieces(json.dumps(block["input"]))
        ]
    events = [sse("content_block_start", _indexed("content_block_start", index, empty))]
    for delta in deltas:
        data = {"type": "content_block_delta", "index": index, "delta": delta}
        events.append(sse("content_block_delta", data))
    events.append(sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def _indexed(kind: str, index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "index": index, "content_block": block}


def sse(event: str, data: Mapping[str, Any]) -> bytes:
    """One named event, as the Messages API sends them."""
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()
