"""Anthropic's Messages API over httpx: the `ChatModel` for profiles of kind "anthropic".

Imported by `app.runner.episode` (through the profile's kind) and tests. Native tool
use and extended thinking (turned on through `extra_body`, e.g.
`{"thinking": {"type": "enabled", "budget_tokens": 4096}}`); thinking text
becomes the step's reasoning and its blocks are sent back verbatim. Retries,
backoff, Retry-After and the context-length recovery are `app.llm.transport`'s.
With an `on_delta` callback the answer is streamed (SSE) and its text and
thinking arrive as deltas.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Unpack

import httpx

from app.agent.types import Completion, DeltaCallback, Message, ToolSchema
from app.llm.anthropic_stream import MessageAssembler, StreamError
from app.llm.anthropic_wire import parse_message, request_parts
from app.llm.sse import sse_data, sse_lines
from app.llm.transport import Failure, HTTPChatModel, ModelOptions, transport_failure

API_VERSION = "2023-06-01"
RETRYABLE_STREAM_ERRORS = {"overloaded_error", "api_error", "rate_limit_error", "incomplete"}
PROTECTED_KEYS = frozenset({"model", "messages", "system", "tools", "max_tokens", "stream"})
"""Request fields extra_body cannot override: the loop and the server decide them."""
MALFORMED = (AttributeError, KeyError, IndexError, TypeError, ValueError)


class AnthropicChatModel(HTTPChatModel):
    """Calls `{base_url}/messages` (base_url like `https://api.anthropic.com/v1`)."""

    def __init__(self, *, base_url: str, api_key: str, **options: Unpack[ModelOptions]) -> None:
        headers = {"anthropic-version": API_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        url = base_url.rstrip("/") + "/messages"
        super().__init__(url=url, api_key=api_key, headers=headers, **options)

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        on_delta: DeltaCallback | None = None,
    ) -> Completion:
        """One answer with the tools offered (streamed when on_delta is given); LLMError at last."""
        body = self.build_body(messages, tools)
        if on_delta is not None:
            body["stream"] = True
        completion, _ = await self._with_retries(
            lambda: self._attempt(body, on_delta),
            lambda failure: self._shrink_max_tokens(body, failure),
        )
        return completion

    def build_body(
        self, messages: Sequence[Message], tools: Sequence[ToolSchema]
    ) -> dict[str, Any]:
        """The request JSON: system apart, content blocks, tools with input_schema."""
        system, turns, definitions = request_parts(messages, tools)
        body: dict[str, Any] = {"model": self.model, "max_tokens": self._max_tokens}
        if system:
            body["system"] = system
        body["messages"] = turns
        if definitions:
            body["tools"] = definitions
        # Extended thinking accepts no temperature but 1: leave it to the API's default then.
        thinking = self._extra_body.get("thinking")
        thinking_on = isinstance(thinking, dict) and thinking.get("type") == "enabled"
        if self._temperature is not None and not thinking_on:
            body["temperature"] = self._temperature
        body.update({k: v for k, v in self._extra_body.items() if k not in PROTECTED_KEYS})
        return body

    async def _attempt(
        self, body: dict[str, Any], on_delta: DeltaCallback | None
    ) -> Completion | Failure:
        """One request: the completion, or what went wrong (a protocol error is not retryable)."""
        try:
            async with self._client.stream(
                "POST", self.url, json=body, headers=self._headers, timeout=self._timeout
            ) as response:
                if not response.is_success:
                    await response.aread()
                    return self._endpoint.http_failure(response)
                content_type = response.headers.get("content-type", "")
                if content_type.startswith("text/event-stream"):  # else a proxy answered JSON
                    return await self._read_stream(response, on_delta)
                await response.aread()
                return self._parse(response)
        except httpx.TransportError as exc:
            return transport_failure(exc)

    async def _read_stream(
        self, response: httpx.Response, on_delta: DeltaCallback | None
    ) -> Completion | Failure:
        assembler = MessageAssembler(on_delta)
        try:
            async for data in sse_data(sse_lines(response.aiter_text())):
                await assembler.feed(json.loads(data))
            if not assembler.done:
                raise StreamError("incomplete", "the stream ended before message_stop")
            return parse_message(assembler.message)
        except StreamError as exc:
            retryable = exc.kind in RETRYABLE_STREAM_ERRORS
            return Failure(f"stream failed: {exc}", retryable=retryable, body=str(exc))
        except MALFORMED as exc:
            return Failure(f"malformed event stream ({exc!r})", False, response.status_code)

    def _parse(self, response: httpx.Response) -> Completion | Failure:
        """The message in a successful answer, or a protocol failure (not retried)."""
        try:
            return parse_message(response.json())
        except MALFORMED as exc:
            excerpt = self._endpoint.excerpt(response.text)
            return Failure(f"malformed message ({exc!r}): {excerpt}", False, response.status_code)
