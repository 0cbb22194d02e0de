"""OpenAI-compatible chat completions over httpx: the production `ChatModel`.

Imported by the worker and `sandhive run`. One POST per turn, bounded retries
with backoff, and every failure turned into `LLMError` at this boundary.
A 2xx body that is not a chat completion is a protocol error: it is raised
after that one attempt, not retried (a wrong base URL will not heal itself).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from app.agent.types import Completion, DeltaCallback, Message, ToolCall, ToolSchema
from app.errors import LLMError

MAX_BACKOFF_S = 30.0
MAX_RETRY_AFTER_S = 60.0
MAX_CONNECT_TIMEOUT_S = 30.0
EXCERPT_CHARS = 300


@dataclass(frozen=True)
class _Failure:
    """Why one attempt failed, and whether another attempt may help."""

    description: str
    retryable: bool
    status: int | None = None
    retry_after_s: float | None = None


class OpenAIChatModel:
    """Calls `{base_url}/chat/completions` with native tool calling."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        temperature: float | None,
        max_tokens: int | None,
        extra_body: Mapping[str, Any] | None = None,
        timeout_s: float = 1200.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self._api_key = api_key
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._temperature = temperature
        self._max_tokens = max_tokens
        self._extra_body = dict(extra_body or {})
        # A dead host should not hold a slot for the whole read timeout.
        self._timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, MAX_CONNECT_TIMEOUT_S))
        self._max_retries = max_retries
        self._backoff_s = backoff_s
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient()

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        on_delta: DeltaCallback | None = None,
    ) -> Completion:
        """One completion with the tools offered; LLMError after the allowed retries.

        Not streamed yet: `on_delta` is accepted for the ChatModel protocol and unused.
        """
        return await self._post(self.build_body(messages, tools))

    async def aclose(self) -> None:
        """Close the HTTP client, but only one this model created itself."""
        if self._owns_client:
            await self._client.aclose()

    def build_body(
        self, messages: Sequence[Message], tools: Sequence[ToolSchema]
    ) -> dict[str, Any]:
        """The request JSON, with the reference package's parameter rules."""
        body: dict[str, Any] = {"model": self.model, "messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        if self._max_tokens is not None:
            body["max_tokens"] = self._max_tokens
        # Reference: temperature is dropped for reasoning models named o3/o4 (substring test).
        if self._temperature is not None and "o3" not in self.model and "o4" not in self.model:
            body["temperature"] = self._temperature
        body.update(self._extra_body)
        return body

    async def _post(self, body: dict[str, Any]) -> Completion:
        """POST with retries; the first 2xx answer, parsed."""
        attempts = self._max_retries + 1
        for attempt in range(1, attempts + 1):
            outcome = await self._attempt(body)
            if isinstance(outcome, httpx.Response):
                return self._parse(outcome, attempt)
            if not outcome.retryable or attempt == attempts:
                raise self._error(outcome.description, outcome.status, attempt)
            await asyncio.sleep(retry_delay(attempt, self._backoff_s, outcome.retry_after_s))
        raise AssertionError("unreachable")  # pragma: no cover - the loop always returns or raises

    async def _attempt(self, body: dict[str, Any]) -> httpx.Response | _Failure:
        """One request; a 2xx response, or a description of what went wrong."""
        try:
            response = await self._client.post(
                self.url, json=body, headers=self._headers, timeout=self._timeout
            )
        except httpx.TimeoutException as exc:
            return _Failure(f"timed out: {type(exc).__name__}", retryable=True)
        except httpx.TransportError as exc:
            return _Failure(f"unreachable: {exc!r}", retryable=True)
        if response.is_success:
            return response
        status = response.status_code
        return _Failure(
            f"HTTP {status}: {self._excerpt(response.text)}",
            retryable=status == 429 or status >= 500,
            status=status,
            retry_after_s=parse_retry_after(response.headers.get("retry-after")),
        )

    def _parse(self, response: httpx.Response, attempt: int) -> Completion:
        """The completion in a successful answer, or a protocol error (not retried)."""
        status = response.status_code
        try:
            data = response.json()
        except ValueError as exc:
            excerpt = self._excerpt(response.text)
            raise self._error(f"answer is not JSON: {excerpt}", status, attempt) from exc
        try:
            return parse_completion(data)
        except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:
            excerpt = self._excerpt(response.text)
            raise self._error(
                f"malformed chat completion ({exc!r}): {excerpt}", status, attempt
            ) from exc

    def _excerpt(self, text: str) -> str:
        """A short, key-free slice of a response body for error messages."""
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return " ".join(text.split())[:EXCERPT_CHARS] or "(empty body)"

    def _error(self, description: str, status: int | None, attempts: int) -> LLMError:
        """The LLMError for this endpoint, naming what failed and how often it was tried."""
        endpoint = redact_url(self.url)
        message = f"LLM endpoint {endpoint}: {description} (after {attempts} attempt(s))"
        details = {"endpoint": endpoint, "status": status, "attempts": attempts}
        return LLMError(message, details)


def retry_delay(attempt: int, backoff_s: float, retry_after_s: float | None) -> float:
    """Seconds to wait after failed attempt N: the server's wish, else exponential backoff."""
    if retry_after_s is not None:
        return min(max(retry_after_s, 0.0), MAX_RETRY_AFTER_S)
    return min(backoff_s * 2.0 ** (attempt - 1), MAX_BACKOFF_S)


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def redact_url(url: str) -> str:
    """The URL without user info or query string, safe to show in messages."""
    parsed = httpx.URL(url)
    return str(parsed.copy_with(username=None, password=None, query=None))


def parse_completion(data: Any) -> Completion:
    """Turn a chat.completion JSON object into a `Completion`; raises on a malformed one."""
    message = data["choices"][0]["message"]
    if not isinstance(message, dict):
        raise TypeError("choices[0].message is not an object")
    usage = data.get("usage") or {}
    return Completion(
        message=history_message(message),
        content=text_of(message.get("content")),
        reasoning=text_of(message.get("reasoning_content") or message.get("reasoning")),
        tool_calls=tuple(parse_tool_call(call) for call in message.get("tool_calls") or ()),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
    )


def history_message(message: dict[str, Any]) -> Message:
    """The assistant message to send back on later turns, as the model returned it."""
    kept = {key: value for key, value in message.items() if value is not None}
    # Strict OpenAI-style APIs reject an empty tool_calls array in a request.
    if kept.get("tool_calls") == []:
        del kept["tool_calls"]
    kept["role"] = "assistant"
    return kept


def parse_tool_call(call: Any) -> ToolCall:
    """One native tool call; arguments decoded when they are a JSON object, else None."""
    function = call["function"]
    raw = function.get("arguments")
    if isinstance(raw, dict):  # some servers (Ollama) send an object, not JSON text
        return ToolCall(str(call.get("id") or ""), str(function["name"]), raw, json.dumps(raw))
    raw_text = raw if isinstance(raw, str) else ""
    return ToolCall(
        id=str(call.get("id") or ""),
        name=str(function["name"]),
        arguments=decode_arguments(raw_text),
        raw_arguments=raw_text,
    )


def decode_arguments(raw: str) -> dict[str, Any] | None:
    """The arguments object, or None when the text is not JSON or not an object."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def text_of(value: Any) -> str:
    """Message text from a string or a list of content parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(part.get("text", "") for part in value if isinstance(part, dict))
    return ""
