"""Token capture for RL: what a trainer that owns the model needs back from each call.

Imported by `app.llm.openai` (and its stream reader). With `llm.capture` the request
asks for the sampled tokens' log-probabilities (`logprobs: true`, standard OpenAI) and
their ids (`return_token_ids: true`: vLLM >= 0.10.2 returns a top-level
`prompt_token_ids` and `choices[0].token_ids`, streamed or not; SGLang returns them per
choice, not streamed, or in its `sglext` extension; llama.cpp ignores the field but names
each sampled token's `id` in its logprob entry, streamed or not). Whatever the server returned is
read here from the one chat.completion shape both paths produce (`app.llm.sse`
assembles a stream into it); what it did not return stays None, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

CAPTURE_BODY = {"logprobs": True, "return_token_ids": True}
"""The request fields that ask for capture (a server refusing `return_token_ids` is
asked again without it: logprobs are then all there is)."""


def capture_of(
    data: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    response: Mapping[str, Any],
) -> dict[str, Any]:
    """One call's capture: the exact request (messages and tools), the ids and logprobs
    the server sent, its finish reason and the assistant message kept in history."""
    choice = data["choices"][0]
    sglext = data.get("sglext")
    ext: Mapping[str, Any] = sglext if isinstance(sglext, dict) else {}
    prompt_ids = _ints(data.get("prompt_token_ids"))
    if prompt_ids is None:
        prompt_ids = _ints(choice.get("prompt_token_ids")) or _ints(ext.get("prompt_token_ids"))
    token_ids = _ints(choice.get("token_ids"))
    if token_ids is None:
        token_ids = _ints(ext.get("completion_token_ids"))
    if token_ids is None:
        token_ids = sampled_ids(choice.get("logprobs"))
    return {
        "request": [dict(message) for message in messages],
        "tools": [dict(tool) for tool in tools],
        "prompt_token_ids": prompt_ids,
        "token_ids": token_ids,
        "logprobs": sampled_logprobs(choice.get("logprobs")),
        "finish_reason": choice.get("finish_reason"),
        "response": dict(response),
    }


def sampled_logprobs(value: Any) -> list[float] | None:
    """The log-probability of each sampled token (`logprobs.content[i].logprob`)."""
    found = _per_token(value, "logprob", (int, float))
    return None if found is None else [float(logprob) for logprob in found]


def sampled_ids(value: Any) -> list[int] | None:
    """Each sampled token's id where the server names it in its logprob entry
    (`logprobs.content[i].id`: llama.cpp); None unless every entry has one."""
    found = _per_token(value, "id", (int,))
    return None if found is None else [int(token) for token in found]


def _per_token(value: Any, field: str, kinds: tuple[type, ...]) -> list[Any] | None:
    """`field` of every `logprobs.content` entry; None if any lacks it (or bool: not a number)."""
    content = value.get("content") if isinstance(value, dict) else None
    if not isinstance(content, list):
        return None
    found: list[Any] = []
    for entry in content:
        item = entry.get(field) if isinstance(entry, dict) else None
        if not isinstance(item, kinds) or isinstance(item, bool):
            return None
        found.append(item)
    return found


def _ints(value: Any) -> list[int] | None:
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        return None
    return list(value)
