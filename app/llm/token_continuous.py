"""Token-continuous rollouts: the model client that keeps a rollout's token sequence and
asks the server to continue it (`llm.tokens: "continuous"`, docs/rl.md).

A chat endpoint renders and tokenizes the whole conversation again every turn, and what
it renders for the model's own answer (its parsed tool call, re-serialised) is not the
tokens the model sampled: turn k+1's prompt then need not start with turn k's prompt and
completion, which a trainer that learns from one flattened sequence per rollout needs.
Here the client owns the tokens:

- the first prompt is the conversation rendered by the server's chat template
  (`/apply-template`) and tokenized by the server (`/tokenize`);
- each completion comes from `{base_url}/completions` with the prompt as token ids, and
  its sampled ids (`logprobs.content[i].id` from llama.cpp, `token_ids` from vLLM) are
  appended as they were sampled;
- what the environment adds after an answer (the end of the assistant's turn, the tool
  results, the next assistant header) is rendered by the template with the answer
  replaced by a marker, the text after the marker tokenized and appended; an
  end-of-turn token the model sampled itself is not added twice.

So every prompt is the previous prompt + completion + the environment's tokens, by
construction. The answer text is parsed for Hermes-style `<tool_call>` blocks
(`app.domain.hermes_calls`): a template that writes calls another way is not read.
A server without `/apply-template` and `/tokenize` (llama.cpp has both) cannot be used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

import httpx

from app.agent.types import Completion, DeltaCallback, Message, ToolSchema
from app.domain.hermes_calls import split_tool_calls
from app.errors import LLMError
from app.llm.capture import sampled_ids, sampled_logprobs
from app.llm.tool_calls import parse_tool_calls
from app.llm.transport import HTTPChatModel, ModelOptions

MARKER = "\u2063SANDHIVE-ANSWER\u2063"
"""Stands in for the model's answer when the environment's tokens are rendered: text no
model writes and no template rewrites (a plain string content)."""


class TokenContinuousModel(HTTPChatModel):
    """One rollout's model (the worker builds one per task): its token sequence grows."""

    def __init__(self, *, base_url: str, api_key: str, **options: Unpack[ModelOptions]) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        base = base_url.rstrip("/")
        super().__init__(url=base + "/completions", api_key=api_key, headers=headers, **options)
        self._root = base.removesuffix("/v1")
        self._ids: list[int] = []
        """The rollout so far: the last prompt and its completion."""
        self._sent = 0
        """How many messages `_ids` holds (the last one the model's answer)."""
        self._eos_sampled = False

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        on_delta: DeltaCallback | None = None,
    ) -> Completion:
        prompt = await self._prompt(messages, tools)
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "logprobs": 1}
        body["return_token_ids"] = True
        if self._max_tokens is not None:
            body["max_tokens"] = self._max_tokens
        if self._temperature is not None:
            body["temperature"] = self._temperature
        body.update(self._extra_body)
        response, attempt = await self._with_retries(
            lambda: self._post_json(self.url, body),
            lambda failure: self._shrink_max_tokens(body, failure),
        )
        data = _json(response, self, attempt)
        try:
            choice = data["choices"][0]
            ids = _ints(choice.get("token_ids")) or sampled_ids(choice.get("logprobs"))
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            excerpt = self._endpoint.excerpt(response.text)
            raise self._endpoint.error(
                f"malformed completion ({exc!r}): {excerpt}", response.status_code, attempt
            ) from exc
        if ids is None:
            raise self._endpoint.error(
                "the server sent no token ids", response.status_code, attempt
            )
        text = str(choice.get("text") or "")
        if on_delta is not None and text:
            await on_delta("text", text)
        self._ids, self._sent = [*prompt, *ids], len(messages) + 1
        self._eos_sampled = choice.get("finish_reason") == "stop"
        return self._completion(messages, tools, prompt, ids, choice, text)

    async def _prompt(self, messages: Sequence[Message], tools: Sequence[ToolSchema]) -> list[int]:
        """The prompt's ids: the previous prompt, completion and the environment's tokens
        (the whole conversation rendered on the first turn, or for a history it did not
        build)."""
        if not self._ids or len(messages) <= self._sent:  # the first turn (or a new history)
            text = await self._render(messages, tools)
            return await self._tokenize(text, special=True)
        answered = dict(messages[self._sent - 1])
        if answered.get("role") != "assistant":
            raise LLMError("token-continuous: the history no longer ends with the model's answer")
        marked = [*messages[: self._sent - 1], {"role": "assistant", "content": MARKER}]
        text = await self._render([*marked, *messages[self._sent :]], tools)
        at = text.find(MARKER)
        if at < 0:
            raise LLMError("token-continuous: the chat template dropped the answer's marker")
        added = await self._tokenize(text[at + len(MARKER) :], special=False)
        if self._eos_sampled and added and self._ids and added[0] == self._ids[-1]:
            added = added[1:]  # the end of turn the model sampled itself
        return [*self._ids, *added]

    async def _render(self, messages: Sequence[Message], tools: Sequence[ToolSchema]) -> str:
        body: dict[str, Any] = {"messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        data = _json(await self._call("/apply-template", body), self, 1)
        if not isinstance(data, dict) or not isinstance(data.get("prompt"), str):
            raise LLMError("token-continuous: /apply-template sent no prompt")
        return str(data["prompt"])

    async def _tokenize(self, text: str, *, special: bool) -> list[int]:
        body = {"content": text, "add_special": special, "parse_special": True}
        data = _json(await self._call("/tokenize", body), self, 1)
        tokens = _ints(data.get("tokens")) if isinstance(data, dict) else None
        if tokens is None:
            raise LLMError("token-continuous: /tokenize sent no token ids")
        return tokens

    async def _call(self, route: str, body: dict[str, Any]) -> httpx.Response:
        """POST to one of the server's own routes, the failure naming it."""
        url = self._root + route
        try:
            response, _ = await self._with_retries(
                lambda: self._post_json(url, body), lambda _f: False
            )
        except LLMError as exc:
            status = exc.details.get("status") if isinstance(exc.details, dict) else None
            said = f"token-continuous: {route}: {exc.message}"
            if status in (404, 405, 501):
                needs = "token-continuous mode needs the server's /apply-template and /tokenize"
                said = f"{needs} (llama.cpp's): {route}: {exc.message}"
            raise LLMError(said, exc.details) from exc
        return response

    def _completion(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        prompt: list[int],
        ids: list[int],
        choice: dict[str, Any],
        text: str,
    ) -> Completion:
        content, functions = split_tool_calls(text)
        wire = [
            {"id": f"call_{len(messages)}_{n}", "type": "function", "function": function}
            for n, function in enumerate(functions)
        ]
        calls, _ = parse_tool_calls(wire)
        message: Message = {"role": "assistant", "content": content}
        if wire:
            message["tool_calls"] = wire
        capture = {
            "request": [dict(m) for m in messages],
            "tools": [dict(t) for t in tools],
            "prompt_token_ids": prompt,
            "token_ids": ids,
            "logprobs": _logprobs(choice),
            "finish_reason": choice.get("finish_reason"),
            "response": message,
        }
        return Completion(
            message=message,
            content=content,
            tool_calls=calls,
            prompt_tokens=len(prompt),
            completion_tokens=len(ids),
            capture=capture,
        )


def _logprobs(choice: dict[str, Any]) -> list[float] | None:
    """llama.cpp's per-token entries, or the legacy completions list (vLLM)."""
    found = sampled_logprobs(choice.get("logprobs"))
    if found is not None:
        return found
    legacy = (choice.get("logprobs") or {}).get("token_logprobs")
    if isinstance(legacy, list) and all(isinstance(v, int | float) for v in legacy):
        return [float(v) for v in legacy]
    return None


def _json(response: httpx.Response, model: TokenContinuousModel, attempt: int) -> Any:
    try:
        return response.json()
    except ValueError as exc:
        excerpt = model._endpoint.excerpt(response.text)
        raise model._endpoint.error(
            f"answer is not JSON: {excerpt}", response.status_code, attempt
        ) from exc


def _ints(value: Any) -> list[int] | None:
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        return None
    return list(value)
