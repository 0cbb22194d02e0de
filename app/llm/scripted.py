"""The scripted LLM: a real OpenAI-compatible HTTP server that plays fixed turns.

Used by tests and by `sandhive demo` in place of a paid model; nothing else is
faked. Stateless per request: the request's `model` picks a `Script`, and the
number of assistant messages already in `messages` picks the turn. The same
scripts also answer Anthropic's Messages API at `/v1/messages`
(`app.llm.scripted_anthropic`).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.llm.scripted_stream import streaming_response

REQUIRED_TOOLS = ("execute_bash", "str_replace_editor", "submit")
EXHAUSTED = "script exhausted"


@dataclass(frozen=True)
class Turn:
    """One scripted assistant answer: a tool call, or plain text when `tool` is None."""

    tool: str | None = None
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    """A str is sent verbatim as the arguments JSON text (to test malformed arguments)."""
    content: str = ""
    reasoning: str = ""
    expect: str | None = None
    """A substring the newest tool/user message must contain, else HTTP 409."""
    delay_s: float = 0.0
    extra_calls: Sequence[Mapping[str, Any]] = ()
    """Raw tool-call objects sent verbatim after the turn's own call (parallel or odd shapes)."""
    stream_delay_s: float = 0.0
    """Pause between the chunks of a streamed answer (requests with `"stream": true`)."""


@dataclass(frozen=True)
class Script:
    """The turns one model name plays, and how it misbehaves."""

    turns: Sequence[Turn]
    repeat_last: bool = False
    fail_status: int | None = None
    """Answer with this HTTP status instead of a completion."""
    fail_count: int | None = None
    """Fail only the first N requests for this model (None: every request)."""
    retry_after_s: float | None = None
    """Retry-After header value sent with the failures."""
    context_window: int | None = None
    """Refuse (HTTP 400) a request whose prompt (chars / 4) plus max_tokens exceeds this."""
    context_error: Literal["sglang", "openai", "vague"] = "sglang"
    """How that refusal reads: naming both numbers (two dialects) or neither."""


class ScriptBook:
    """The scripts by model name and what the server saw; shared across threads."""

    def __init__(self, scripts: Mapping[str, Script] | None = None) -> None:
        self._lock = threading.Lock()
        self._scripts = dict(scripts or {})
        self._failures: list[str] = []
        self._requests: dict[str, int] = {}
        self._last_bodies: dict[str, dict[str, Any]] = {}
        self._last_headers: dict[str, dict[str, str]] = {}
        self._arrivals: dict[str, list[float]] = {}

    def add_script(self, model: str, script: Script) -> None:
        """Register or replace a script; callable from any thread while serving."""
        with self._lock:
            self._scripts[model] = script

    def receive(
        self, model: str, body: dict[str, Any], headers: Mapping[str, str]
    ) -> tuple[Script | None, int]:
        """Count a chat request; its script (None if unknown) and its 1-based number."""
        arrived = time.monotonic()
        with self._lock:
            self._arrivals.setdefault(model, []).append(arrived)
            count = self._requests.get(model, 0) + 1
            self._requests[model] = count
            self._last_bodies[model] = body
            self._last_headers[model] = dict(headers)
            return self._scripts.get(model), count

    def models(self) -> list[str]:
        """The registered model names, sorted."""
        with self._lock:
            return sorted(self._scripts)

    def fail(self, description: str) -> None:
        """Remember an expectation failure for the test to assert on."""
        with self._lock:
            self._failures.append(description)

    @property
    def failures(self) -> list[str]:
        """A snapshot: the list is copied under the lock."""
        with self._lock:
            return list(self._failures)

    @property
    def requests(self) -> dict[str, int]:
        """Model name -> chat requests received (a snapshot)."""
        with self._lock:
            return dict(self._requests)

    def arrivals(self, model: str) -> list[float]:
        """`time.monotonic()` at the arrival of each chat request for this model (benchmarks)."""
        with self._lock:
            return list(self._arrivals.get(model, []))

    def last_request(self, model: str) -> dict[str, Any] | None:
        """The JSON body of the newest chat request for this model."""
        with self._lock:
            return self._last_bodies.get(model)

    def last_headers(self, model: str) -> dict[str, str] | None:
        """The (lower-cased) HTTP headers of the newest chat request for this model."""
        with self._lock:
            return self._last_headers.get(model)


def create_app(scripts: Mapping[str, Script] | ScriptBook) -> Starlette:
    """The ASGI app; its `ScriptBook` (failures, counters) is at `app.state.book`."""
    book = scripts if isinstance(scripts, ScriptBook) else ScriptBook(scripts)

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

    # Imported here: the Anthropic face builds on this module's Script and ScriptBook.
    from app.llm.scripted_anthropic import anthropic_routes

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", list_models, methods=["GET"]),
            *anthropic_routes(book),
        ]
    )
    app.state.book = book
    return app


async def answer(book: ScriptBook, body: dict[str, Any], headers: Mapping[str, str]) -> Response:
    """Play the turn this request asks for, or the failure the script prescribes."""
    model = str(body.get("model", ""))
    script, count = book.receive(model, body, headers)
    if script is None:
        return error_response(404, f"unknown model {model!r}", "model_not_found")
    if script.fail_status is not None and (script.fail_count is None or count <= script.fail_count):
        return failure_response(script)
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    overflow = context_overflow(script, body)
    if overflow is not None:
        return error_response(400, overflow, "context_length_exceeded")
    check_tools(book, model, body.get("tools"))
    index = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
    turn = pick_turn(script, index)
    mismatch = check_expect(turn, messages)
    if mismatch is not None:
        book.fail(f"{model} turn {index}: {mismatch}")
        return error_response(409, f"scripted expectation failed: {mismatch}", "expect_failed")
    if turn.delay_s > 0:
        await asyncio.sleep(turn.delay_s)
    completion = render_completion(model, index, turn, body)
    if body.get("stream") is True:
        return streaming_response(completion, body, turn.stream_delay_s)
    return JSONResponse(completion)


def prompt_tokens_of(body: Mapping[str, Any]) -> int:
    """The scripted tokenizer: characters of the messages (and system) as JSON, / 4."""
    return len(json.dumps([body.get("system", ""), body.get("messages", [])])) // 4


def context_overflow(script: Script, body: Mapping[str, Any]) -> str | None:
    """The context-length error text when prompt + max_tokens does not fit the window."""
    window = script.context_window
    max_tokens = body.get("max_tokens")
    if window is None or not isinstance(max_tokens, int):
        return None
    used = prompt_tokens_of(body)
    if used + max_tokens <= window:
        return None
    if script.context_error == "openai":
        return (
            f"This model's maximum context length is {window} tokens. However, you requested "
            f"{used + max_tokens} tokens ({used} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion."
        )
    if script.context_error == "vague":
        return "Input tokens exceed the configured limit of the model."
    return (
        f"Requested token count exceeds the model's maximum context length of {window} tokens. "
        f"You requested a total of {used + max_tokens} tokens: {used} tokens from the input "
        f"messages and {max_tokens} tokens for the completion."
    )


def pick_turn(script: Script, index: int) -> Turn:
    """The turn for this position; past the end, the last one again or an 'exhausted' text."""
    if index < len(script.turns):
        return script.turns[index]
    if script.repeat_last and script.turns:
        return script.turns[-1]
    return Turn(content=EXHAUSTED)


def check_tools(book: ScriptBook, model: str, tools: Any) -> None:
    """Record a failure when the request does not offer all three agent tools."""
    names = set()
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
            names.add(tool["function"].get("name"))
    missing = [name for name in REQUIRED_TOOLS if name not in names]
    if missing:
        book.fail(f"{model}: request lacks tool schemas {missing}")


def check_expect(turn: Turn, messages: list[Any]) -> str | None:
    """A description of the mismatch, or None when the expectation holds."""
    if turn.expect is None:
        return None
    newest = next(
        (
            m
            for m in reversed(messages)
            if isinstance(m, dict) and m.get("role") in {"tool", "user"}
        ),
        None,
    )
    text = message_text(newest.get("content")) if newest is not None else ""
    if turn.expect in text:
        return None
    return f"expected {turn.expect!r} in the newest tool/user message, got {text[:200]!r}"


def message_text(content: Any) -> str:
    """The text of a message's content, whether a string or content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else json.dumps(content)


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


class ScriptedLLMServer:
    """Runs `create_app` under uvicorn in a background thread on a free local port."""

    def __init__(
        self, scripts: Mapping[str, Script] | None = None, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.book = ScriptBook(scripts)
        self._host = host
        self._port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """`http://HOST:PORT/v1`; valid once started."""
        if self._server is None:
            raise RuntimeError("ScriptedLLMServer is not started")
        return f"http://{self._host}:{self._port}/v1"

    @property
    def failures(self) -> list[str]:
        """Expectation failures seen so far (tests assert this is empty)."""
        return self.book.failures

    @property
    def requests(self) -> dict[str, int]:
        """Model name -> chat requests received."""
        return self.book.requests

    def add_script(self, model: str, script: Script) -> None:
        """Register (or replace) the script a model name plays; safe while serving."""
        self.book.add_script(model, script)

    def arrivals(self, model: str) -> list[float]:
        """`time.monotonic()` at each chat request's arrival for this model (same process)."""
        return self.book.arrivals(model)

    def last_request(self, model: str) -> dict[str, Any] | None:
        """The JSON body of the newest chat request for this model."""
        return self.book.last_request(model)

    def last_headers(self, model: str) -> dict[str, str] | None:
        """The (lower-cased) HTTP headers of the newest chat request for this model."""
        return self.book.last_headers(model)

    def start(self, timeout_s: float = 10.0) -> None:
        """Bind, serve from a thread with its own event loop, and wait until it accepts."""
        if self._server is not None:
            raise RuntimeError("ScriptedLLMServer is already started")
        # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets whose proto says
        # TCP, and without it every reused connection waits ~40 ms (Nagle + delayed ACK).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            create_app(self.book),
            loop="asyncio",
            lifespan="off",
            ws="none",
            log_config=None,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="scripted-llm", daemon=True
        )
        self._thread.start()
        self._wait_started(self._server, self._thread, timeout_s)

    def _wait_started(
        self, server: uvicorn.Server, thread: threading.Thread, timeout_s: float
    ) -> None:
        """Block until uvicorn reports started; fail loudly if its thread died."""
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("scripted LLM server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        """Ask uvicorn to exit and join its thread."""
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._server = None
        self._thread = None

    def __enter__(self) -> ScriptedLLMServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


DEMO_MODEL = "scripted-demo"
DEMO_ANSWER = "16796"
DEMO_PROMPT = (
    "Scripted demo: compute the 10th Catalan number with Python and write it to "
    "/testbed/output/answer.txt."
)
DEMO_SCRIPT = Script(
    turns=(
        Turn(
            tool="execute_bash",
            arguments={"command": "python3 -c 'from math import comb; print(comb(20, 10) // 11)'"},
            content="(Scripted demo, not a real model.) Computing the 10th Catalan number "
            "with Python in the sandbox.",
        ),
        Turn(
            tool="str_replace_editor",
            arguments={
                "command": "create",
                "path": "/testbed/output/answer.txt",
                "file_text": DEMO_ANSWER,
            },
            content="(Scripted demo.) Python printed 16796; writing it to the answer file.",
            expect=DEMO_ANSWER,
        ),
        Turn(
            tool="submit",
            arguments={},
            content="(Scripted demo.) The answer is in /testbed/output/answer.txt; submitting.",
        ),
    )
)
"""A canned task for `sandhive demo`: compute in the sandbox, write the answer, submit."""
