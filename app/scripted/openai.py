"""The scripted server's OpenAI face: `POST /v1/chat/completions` and `GET /v1/models`.

Answers a chat completion for the turn the request asks for (plainly, or as
Server-Sent Events when it says `"stream": true`), or the failure its script
prescribes. Records a failure when a request does not offer the three agent
tools (or, for a `tools="none"` script, offers any, or sends `tool_choice`), and
answers HTTP 409 when a turn's `expect` does not hold.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.scripted.script import (
    Script,
    ScriptBook,
    Turn,
    check_expect,
    context_overflow,
    pick_turn,
    tools_problem,
)
from app.scripted.stream import streaming_response
from app.scripted.tokens import add_capture


def openai_routes(book: ScriptBook) -> list[Route]:
    """The `/v1/chat/completions` and `/v1/models` routes over a shared ScriptBook."""

    async def chat_completions(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, "request body is not JSON", "invalid_json")
        if not isinstance(body, dict):
            return error_response(400, "request body is not an object", "invalid_json")
        return await answer(book, body, request.headers)

    async def list_models(request: Request) -> JSONResponse:
        names = book.models()
        data = [{"id": name, "object": "model", "owned_by": "sandhive-scripted"} for name in names]
        return JSONResponse({"object": "list", "data": data})

    return [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
    ]


async def answer(book: ScriptBook, body: dict[str, Any], headers: Mapping[str, str]) -> Response:
    """Play the turn this request asks for, or the failure the script prescribes."""
    model = str(body.get("model", ""))
    script, count = book.receive(model, body, headers)
    if script is None:
        return error_response(404, f"unknown model {model!r}", "model_not_found")
    if script.fails(count):
        return failure_response(script)
    script = script.for_session(book.session_number(model, headers.get("x-session-id")))
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    overflow = context_overflow(script, body)
    if overflow is not None:
        return error_response(400, overflow, "context_length_exceeded")
    check_tools(book, model, script, body)
    index = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
    turn = pick_turn(script, index)
    mismatch = check_expect(turn, messages)
    if mismatch is not None:
        book.fail(f"{model} turn {index}: {mismatch}")
        return error_response(409, f"scripted expectation failed: {mismatch}", "expect_failed")
    if turn.delay_s > 0:
        await asyncio.sleep(turn.delay_s)
    completion = render_completion(model, index, turn, body)
    sent = add_capture(completion, body)
    if sent is not None:
        book.record_sent(model, {**sent, "session": headers.get("x-session-id")})
    if body.get("stream") is True:
        return streaming_response(completion, body, turn.stream_delay_s)
    return JSONResponse(completion)


def check_tools(book: ScriptBook, model: str, script: Script, body: dict[str, Any]) -> None:
    """Record a failure when the request's tools are not what the script expects."""
    tools = body.get("tools")
    if script.tools == "none" and ("tools" in body or "tool_choice" in body):
        book.fail(f"{model}: a no-tools request must send neither tools nor tool_choice")
        return
    names = []
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
            names.append(tool["function"].get("name"))
    problem = tools_problem(script, names)
    if problem is not None:
        book.fail(f"{model}: {problem}")


def render_completion(model: str, index: int, turn: Turn, body: dict[str, Any]) -> dict[str, Any]:
    """A standard chat.completion object for this turn."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.content or None}
    if turn.tool is None and not turn.extra_calls:
        message["content"] = turn.content
    else:
        own = [render_tool_call(index, turn)] if turn.tool is not None else []
        message["tool_calls"] = [*own, *(dict(call) for call in turn.extra_calls)]
    if turn.reasoning:
        message["reasoning_content"] = turn.reasoning
    prompt_tokens = len(json.dumps(body.get("messages", []))) // 4
    completion_tokens = (
        len(turn.content) + len(turn.reasoning) + len(str(turn.arguments))
    ) // 4 + 1
    return {
        "id": f"chatcmpl-scripted-{index}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop" if turn.tool is None else "tool_calls",
                "message": message,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def render_tool_call(index: int, turn: Turn) -> dict[str, Any]:
    """The native tool call of a turn; string arguments pass through untouched."""
    arguments = turn.arguments
    text = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
    return {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": turn.tool, "arguments": text},
    }


def failure_response(script: Script) -> JSONResponse:
    """The scripted HTTP failure, with Retry-After when the script sets one."""
    status = script.fail_status or 500
    response = error_response(status, f"scripted failure {status}", "scripted_failure")
    if script.retry_after_s is not None:
        response.headers["Retry-After"] = f"{script.retry_after_s:g}"
    return response


def error_response(status: int, message: str, code: str) -> JSONResponse:
    """An OpenAI-style error body."""
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return JSONResponse({"error": error}, status_code=status)
