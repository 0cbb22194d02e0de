"""The scripted server's Anthropic face: `POST /v1/messages` in the Messages API wire format.

Mounted by `app.scripted.server.create_app` next to the OpenAI routes and driven
by the same `Script`s (the model name picks the script, the number of
assistant messages picks the turn). It checks what a real Anthropic server
checks and our client could get wrong: the version header, `max_tokens`, the
three tools (none for a `tools="none"` script), every `tool_use` answered by a
`tool_result` in the next user message, and thinking blocks sent back unmodified
(with their signature).
Answers plainly or as Server-Sent Events when the request says `stream`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.scripted.script import (
    Script,
    ScriptBook,
    Turn,
    check_expect,
    context_overflow,
    pick_turn,
    prompt_tokens_of,
    tools_problem,
)
from app.scripted.stream import stream_events


def anthropic_routes(book: ScriptBook) -> list[Route]:
    """The `/v1/messages` route over a shared ScriptBook."""

    async def messages(request: Request) -> Response:
        if not request.headers.get("anthropic-version"):
            return error_response(400, "anthropic-version header is required")
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, "request body is not JSON")
        if not isinstance(body, dict):
            return error_response(400, "request body is not an object")
        return await answer(book, body, request.headers)

    return [Route("/v1/messages", messages, methods=["POST"])]


async def answer(book: ScriptBook, body: dict[str, Any], headers: Mapping[str, str]) -> Response:
    """Play the turn this request asks for, or the failure the script prescribes."""
    model = str(body.get("model", ""))
    script, count = book.receive(model, body, headers)
    if script is None:
        return error_response(404, f"model: {model}", "not_found_error")
    if script.fails(count):
        return failure_response(script)
    problem = check_request(script, body)
    if problem is not None:
        book.fail(f"{model}: {problem}")
        return error_response(400, problem)
    if (overflow := _context_error(script, body)) is not None:
        return error_response(400, overflow)
    messages = body["messages"]
    index = sum(1 for m in messages if m.get("role") == "assistant")
    turn = pick_turn(script, index)
    mismatch = check_expect(turn, [openai_view(m) for m in messages])
    if mismatch is not None:
        book.fail(f"{model} turn {index}: {mismatch}")
        return error_response(409, f"scripted expectation failed: {mismatch}")
    message = render_message(model, index, turn, prompt_tokens_of(body))
    if body.get("stream"):
        return StreamingResponse(stream_events(message), media_type="text/event-stream")
    return JSONResponse(message)


def check_request(script: Script, body: dict[str, Any]) -> str | None:
    """What a real Messages API would refuse in this request, or None."""
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens: field required"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    if script.tools == "none" and ("tools" in body or "tool_choice" in body):
        return "a no-tools request must send neither tools nor tool_choice"
    names = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
    if (problem := tools_problem(script, names)) is not None:
        return problem
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict) or not isinstance(tool.get("input_schema"), dict):
            return "tools: every tool needs an input_schema object"
    return _check_turns(script, messages)


def _check_turns(script: Script, messages: list[Any]) -> str | None:
    """Alternating roles, every tool_use answered, thinking blocks returned verbatim."""
    turn_index = 0
    for position, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str | list):
            return f"messages.{position}: content must be a string or a list of blocks"
        expected = "user" if position % 2 == 0 else "assistant"
        if message.get("role") != expected:
            return f"messages.{position}: roles must alternate user/assistant, starting with user"
        if expected == "assistant":
            problem = _check_assistant(script, turn_index, position, messages)
            if problem is not None:
                return problem
            turn_index += 1
    return None


def _check_assistant(
    script: Script, turn_index: int, position: int, messages: list[Any]
) -> str | None:
    blocks = blocks_of(messages[position])
    turn = pick_turn(script, turn_index)
    if turn.reasoning:
        wanted = thinking_block(turn, turn_index)
        if wanted not in blocks:
            return f"messages.{position}: thinking blocks must be passed back unmodified"
    ids = [b.get("id") for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
    if not ids:
        return None
    following = blocks_of(messages[position + 1]) if position + 1 < len(messages) else None
    if following is None:
        return f"messages.{position}: the last message must be a user message"
    answered = [
        b.get("tool_use_id")
        for b in following
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    if missing := [i for i in ids if i not in answered]:
        return f"messages.{position + 1}: tool_use ids without tool_result blocks: {missing}"
    return None


def _context_error(script: Script, body: dict[str, Any]) -> str | None:
    """Anthropic's own wording for a request that does not fit the window."""
    if context_overflow(script, body) is None:
        return None
    used, window = prompt_tokens_of(body), script.context_window
    return (
        f"input length and `max_tokens` exceed context limit: {used} + {body['max_tokens']} "
        f"> {window}, decrease input length or `max_tokens` and try again"
    )


def blocks_of(message: Mapping[str, Any]) -> list[Any]:
    """The content blocks of a message; a plain string is one text block."""
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def openai_view(message: Mapping[str, Any]) -> dict[str, Any]:
    """A user/assistant message flattened to {role, content text} for `check_expect`."""
    parts: list[str] = []
    for block in blocks_of(message):
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_result":
            parts.append(_result_text(block.get("content")))
    return {"role": message.get("role"), "content": "".join(parts)}


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""


def thinking_block(turn: Turn, index: int) -> dict[str, Any]:
    """The thinking block of a turn, with a signature the server can recognise later."""
    return {"type": "thinking", "thinking": turn.reasoning, "signature": f"sig-scripted-{index}"}


def render_message(model: str, index: int, turn: Turn, input_tokens: int) -> dict[str, Any]:
    """A Messages API `message` object for this turn."""
    blocks: list[dict[str, Any]] = []
    if turn.reasoning:
        blocks.append(thinking_block(turn, index))
    if turn.content or turn.tool is None:
        blocks.append({"type": "text", "text": turn.content})
    if turn.tool is not None:
        blocks.append(_tool_use(f"toolu_scripted_{index}", turn.tool, turn.arguments))
    for n, extra in enumerate(turn.extra_calls):
        function = extra.get("function") or {}
        call_id = str(extra.get("id") or f"toolu_scripted_{index}_{n}")
        blocks.append(_tool_use(call_id, str(function.get("name", "")), function.get("arguments")))
    output_tokens = len(json.dumps(blocks)) // 4 + 1
    return {
        "id": f"msg_scripted_{index}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": "tool_use" if turn.tool is not None else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def _tool_use(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """A tool_use block; arguments given as JSON text are decoded (an object is required)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = {}
    value = dict(arguments) if isinstance(arguments, Mapping) else {}
    return {"type": "tool_use", "id": call_id, "name": name, "input": value}


def failure_response(script: Script) -> JSONResponse:
    """The scripted HTTP failure in Anthropic's error shape, with Retry-After if set."""
    status = script.fail_status or 500
    kind = {429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
    response = error_response(status, f"scripted failure {status}", kind)
    if script.retry_after_s is not None:
        response.headers["Retry-After"] = f"{script.retry_after_s:g}"
    return response


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    """An Anthropic-style error body."""
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return JSONResponse(body, status_code=status)
