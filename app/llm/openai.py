"""OpenAI-compatible chat completions over httpx: the production `ChatModel`.

Imported by the worker and `sandhive run`. One POST per turn, bounded retries
with backoff, and every failure turned into `LLMError` at this boundary.
A 2xx body that is not a chat completion is a protocol error: it is raised
after that one attempt, not retried (a wrong base URL will not heal itself).
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from app.agent.types import Completion, DeltaCallback, Message, ToolSchema
from app.errors import LLMError
from app.llm import sse
from app.llm.recovery import MAX_RECOVERIES, is_context_error, next_max_tokens
from app.llm.tool_calls import parse_tool_calls

MAX_BACKOFF_S = 30.0
MAX_RETRY_AFTER_S = 60.0
MAX_CONNECT_TIMEOUT_S = 30.0
EXCERPT_CHARS = 300
ERROR_BODY_CHARS = 4000


@dataclass(frozen=True)
class _Failure:
    """Why one attempt failed, and whether another attempt may help."""

    description: str
    retryable: bool
    status: int | None = None
    retry_after_s: float | None = None
    body: str = ""
    """The start of the error body, for the context-length recovery."""


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
        stream: bool = True,
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
        self._stream = stream
        """Stream when a caller wants deltas; turned off for good if the server refuses."""
        self._stream_usage = True

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        on_delta: DeltaCallback | None = None,
    ) -> Completion:
        """One completion with the tools offered; LLMError after the allowed retries.

        With `on_delta` (and streaming on) the answer is streamed and each text or
        reasoning fragment is reported as it arrives; the result is the same.
        """
        body = self.build_body(messages, tools)
        return await self._post(body, on_delta if self._stream else None)

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

    async def _post(
        self, body: dict[str, Any], on_delta: DeltaCallback | None = None
    ) -> Completion:
        """POST with retries; the first 2xx answer, parsed."""
        attempts = self._max_retries + 1
        attempt = recoveries = 0
        while True:
            outcome = await self._attempt(body, on_delta)
            if isinstance(outcome, httpx.Response):
                return self._parse(outcome, attempt + 1)
            if recoveries < MAX_RECOVERIES and self._shrink_max_tokens(body, outcome):
                recoveries += 1  # a context-length recovery is not a retry
                continue
            attempt += 1
            if not outcome.retryable or attempt == attempts:
                raise self._error(outcome.description, outcome.status, attempt)
            await asyncio.sleep(retry_delay(attempt, self._backoff_s, outcome.retry_after_s))

    def _shrink_max_tokens(self, body: dict[str, Any], failure: _Failure) -> bool:
        """Lower max_tokens after a context-length error; kept for later turns (input grows)."""
        if not is_context_error(failure.status, failure.body):
            return False
        smaller = next_max_tokens(body.get("max_tokens"), failure.body)
        if smaller is None:
            return False
        body["max_tokens"] = self._max_tokens = smaller
        return True

    async def _attempt(
        self, body: dict[str, Any], on_delta: DeltaCallback | None = None
    ) -> httpx.Response | _Failure:
        """One request; a 2xx response, or a description of what went wrong."""
        try:
            if on_delta is not None and self._stream:
                response = await self._post_streaming(body, on_delta)
            else:
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
            body=response.text[:ERROR_BODY_CHARS],
        )

    async def _post_streaming(
        self, body: dict[str, Any], on_delta: DeltaCallback
    ) -> httpx.Response:
        """A streamed request, answered as if it had not been (the assembled JSON).

        A server that refuses `stream_options` or `stream` (HTTP 400/422 naming it)
        is asked again without it, and not asked with it again.
        """
        streamed = sse.streaming_body(body, include_usage=self._stream_usage)
        async with self._client.stream(
            "POST", self.url, json=streamed, headers=self._headers, timeout=self._timeout
        ) as response:
            if response.is_success and sse.is_event_stream(response):
                try:
                    data = await sse.read_completion(response, on_delta)
                except sse.StreamError as exc:
                    return httpx.Response(response.status_code, text=f"malformed stream: {exc}")
                return httpx.Response(response.status_code, json=data)
            await response.aread()
        refused = sse.refused_option(response)
        if refused == "stream_options" and self._stream_usage:
            self._stream_usage = False
            return await self._post_streaming(body, on_delta)
        if refused == "stream":
            self._stream = False
            return await self._client.post(
                self.url, json=body, headers=self._headers, timeout=self._timeout
            )
        return response

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
    tool_calls, wire_calls = parse_tool_calls(message.get("tool_calls"))
    return Completion(
        message=history_message({**message, "tool_calls": wire_calls}),
        content=text_of(message.get("content")),
        reasoning=text_of(message.get("reasoning_content") or message.get("reasoning")),
        tool_calls=tool_calls,
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


def text_of(value: Any) -> str:
    """Message text from a string or a list of content parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(part.get("text", "") for part in value if isinstance(part, dict))
    return ""
