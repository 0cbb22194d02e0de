"""OpenAI-compatible chat completions over httpx: the production `ChatModel`.

Imported by the worker and `sandhive run`. One POST per turn, bounded retries
with backoff, and every failure turned into `LLMError` at this boundary.
A 2xx body that is not a chat completion is a protocol error: it is raised
after that one attempt, not retried (a wrong base URL will not heal itself).
A model that refuses `temperature` (HTTP 400/422 saying it is unsupported, as
OpenAI's reasoning models do) is asked again without it, and that endpoint and model are not sent a
temperature again for the life of the process.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Unpack

import httpx

from app.agent.types import Completion, DeltaCallback, Message, ToolSchema
from app.llm import sse
from app.llm.capture import CAPTURE_BODY, capture_of
from app.llm.tool_calls import parse_tool_calls
from app.llm.transport import Failure, HTTPChatModel, ModelOptions, transport_failure

# Re-exported: callers and tests have always found these here.
from app.llm.transport import parse_retry_after as parse_retry_after
from app.llm.transport import redact_url as redact_url
from app.llm.transport import retry_delay as retry_delay

TEMPERATURE_REFUSED = re.compile(
    r"unsupported (?:value|parameter)\W+temperature"
    r"|temperature\W+(?:is not|are not|not) supported|temperature\W+does not support"
    r"|does not support\W+(?:the )?temperature",
    re.IGNORECASE,
)
"""A refusal of the parameter itself, not a bad value ("temperature must be <= 2") or a
validation error that merely echoes the request: those are the caller's to fix."""
REFUSES_TEMPERATURE: set[tuple[str, str]] = set()
"""(chat URL, model) pairs that refused a temperature. Process-wide, because the worker
builds one model client per task: without it every task of an o1-style model would
pay one refused request first. Small by nature (configured endpoints x models)."""
REFUSES_TEMPERATURE_MAX = 1024
"""Past this many pairs the memory is cleared (a refusal is then simply learnt again)."""


class OpenAIChatModel(HTTPChatModel):
    """Calls `{base_url}/chat/completions` with native tool calling."""

    def __init__(
        self, *, base_url: str, api_key: str, stream: bool = True, **options: Unpack[ModelOptions]
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        url = base_url.rstrip("/") + "/chat/completions"
        super().__init__(url=url, api_key=api_key, headers=headers, **options)
        self._stream = stream
        """Stream when a caller wants deltas; turned off for good if the server refuses."""
        self._stream_usage = True
        self._capture = options.get("capture", False)

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

    def build_body(
        self, messages: Sequence[Message], tools: Sequence[ToolSchema]
    ) -> dict[str, Any]:
        """The request JSON, with the reference package's parameter rules."""
        body: dict[str, Any] = {"model": self.model, "messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        if self._max_tokens is not None:
            body["max_tokens"] = self._max_tokens
        if self._temperature is not None and self.accepts_temperature():
            body["temperature"] = self._temperature
        if self._capture:
            body.update(CAPTURE_BODY)
        body.update(self._extra_body)
        return body

    def accepts_temperature(self) -> bool:
        """Reference: not for models named o3/o4 (substring test); nor for one that refused it."""
        if "o3" in self.model or "o4" in self.model:
            return False
        return (self.url, self.model) not in REFUSES_TEMPERATURE

    async def _post(
        self, body: dict[str, Any], on_delta: DeltaCallback | None = None
    ) -> Completion:
        """POST with retries; the first 2xx answer, parsed."""
        response, attempt = await self._with_retries(
            lambda: self._attempt(body, on_delta), lambda failure: self._recover(body, failure)
        )
        completion = self._parse(response, attempt)
        if not self._capture:
            return completion
        data = response.json()
        captured = capture_of(data, body["messages"], body.get("tools", ()), completion.message)
        return replace(completion, capture=captured)

    def _recover(self, body: dict[str, Any], failure: Failure) -> bool:
        """Fix the request after a refusal it can be fixed for; such a resend is not a retry."""
        return (
            self._drop_temperature(body, failure)
            or self._shrink_max_tokens(body, failure)
            or _drop_token_ids(body, failure)
        )

    def _drop_temperature(self, body: dict[str, Any], failure: Failure) -> bool:
        """After a 400/422 naming `temperature`: resend without it, and remember the model."""
        refused = (
            failure.status in (400, 422) and TEMPERATURE_REFUSED.search(failure.body) is not None
        )
        if not refused or "temperature" not in body:
            return False
        del body["temperature"]
        if len(REFUSES_TEMPERATURE) >= REFUSES_TEMPERATURE_MAX:
            REFUSES_TEMPERATURE.clear()
        REFUSES_TEMPERATURE.add((self.url, self.model))
        return True

    async def _attempt(
        self, body: dict[str, Any], on_delta: DeltaCallback | None = None
    ) -> httpx.Response | Failure:
        """One request; a 2xx response, or a description of what went wrong."""
        if on_delta is None or not self._stream:
            return await self._post_json(self.url, body)
        try:
            response = await self._post_streaming(body, on_delta)
        except httpx.TransportError as exc:
            return transport_failure(exc)
        return response if response.is_success else self._endpoint.http_failure(response)

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
            excerpt = self._endpoint.excerpt(response.text)
            raise self._endpoint.error(f"answer is not JSON: {excerpt}", status, attempt) from exc
        try:
            return parse_completion(data)
        except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:
            excerpt = self._endpoint.excerpt(response.text)
            raise self._endpoint.error(
                f"malformed chat completion ({exc!r}): {excerpt}", status, attempt
            ) from exc


def _drop_token_ids(body: dict[str, Any], failure: Failure) -> bool:
    """A server that refuses `return_token_ids` (not vLLM or SGLang): logprobs only."""
    refused = failure.status in (400, 422) and "return_token_ids" in failure.body
    if not refused or "return_token_ids" not in body:
        return False
    del body["return_token_ids"]
    return True


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
    # An answer with neither (llama.cpp streams nothing of a tool call cut off by max_tokens)
    # is sent back as empty text: llama.cpp refuses an assistant message without content or
    # tool_calls ("Assistant message must contain either 'content' or 'tool_calls'!").
    if "content" not in kept and "tool_calls" not in kept:
        kept["content"] = ""
    kept["role"] = "assistant"
    return kept


def text_of(value: Any) -> str:
    """Message text from a string or a list of content parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(part.get("text", "") for part in value if isinstance(part, dict))
    return ""
