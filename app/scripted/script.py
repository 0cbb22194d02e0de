"""The script model both faces of the scripted server play: turns, scripts, what was seen.

Stateless per request: the request's `model` picks a `Script`, and the number
of assistant messages already in the history picks the `Turn`. `ScriptBook`
holds the scripts and records what the server received (counters, bodies,
headers, expectation failures) for the tests to assert on. Imported by
`app.scripted.openai` and `app.scripted.anthropic`, which import nothing of
each other.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

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
    tools: Literal["agent", "none"] = "agent"
    """What requests must offer: the three agent tools, or (a vanilla task) no tools at all."""
    session_variants: Sequence[Sequence[Turn]] = ()
    """The n-th distinct session (`x-session-id` header, the worker's default) seen for this
    model plays `session_variants[n % len]` instead of `turns` (OpenAI face): rollouts of
    one group that differ, deterministically. Empty: every session plays `turns`."""

    def for_session(self, number: int | None) -> Script:
        """This script as session number `number` plays it."""
        if not self.session_variants or number is None:
            return self
        variant = self.session_variants[number % len(self.session_variants)]
        return dataclasses.replace(self, turns=variant, session_variants=())

    def fails(self, count: int) -> bool:
        """Whether request number `count` (1-based) gets the scripted HTTP failure."""
        return self.fail_status is not None and (
            self.fail_count is None or count <= self.fail_count
        )


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
        self._sent: dict[str, list[dict[str, Any]]] = {}
        self._sessions: dict[str, dict[str, int]] = {}

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

    def session_number(self, model: str, session: str | None) -> int | None:
        """0 for the first session id seen for `model`, 1 for the next, ...; None: no id."""
        if session is None:
            return None
        with self._lock:
            seen = self._sessions.setdefault(model, {})
            return seen.setdefault(session, len(seen))

    def record_sent(self, model: str, sent: dict[str, Any]) -> None:
        """Keep the token ids and logprobs one answer carried (`app.scripted.tokens`)."""
        with self._lock:
            self._sent.setdefault(model, []).append(sent)

    def sent(self, model: str) -> list[dict[str, Any]]:
        """Every captured answer's ids and logprobs for this model, in order."""
        with self._lock:
            return list(self._sent.get(model, []))

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


def tools_problem(script: Script, names: Sequence[object]) -> str | None:
    """What is wrong with the tools a request offers (by name) for this script, or None."""
    if script.tools == "none":
        return (
            f"request offers tools {sorted(map(str, names))} to a no-tools script"
            if names
            else None
        )
    missing = [name for name in REQUIRED_TOOLS if name not in names]
    return f"request lacks tools {missing}" if missing else None


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


def check_expect(turn: Turn, messages: list[Any]) -> str | None:
    """A description of the mismatch, or None when the expectation holds.

    `messages` in the OpenAI shape ({role, content}); the Anthropic face flattens
    its messages to that first.
    """
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
