"""vLLM-style token capture for the scripted server: ids and logprobs a test can check.

A request with `return_token_ids: true` gets a top-level `prompt_token_ids` and
`choices[0].token_ids` (as vLLM >= 0.10.2 answers), one with `logprobs: true` gets
`choices[0].logprobs.content` (the OpenAI shape); streamed, the prompt ids ride on the
first chunk and each delta chunk carries its share of the ids and logprobs, as vLLM
streams them. The values are deterministic and tied to the request: the prompt ids
are the SHA-256 bytes of the request's messages as canonical JSON (`prompt_ids`), so
a test that rebuilds the exact request from an export can recompute them; the
completion ids are the UTF-8 bytes of what the turn generated. Every answer sent is
recorded in the `ScriptBook` (`sent`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any


def prompt_ids(messages: Any) -> list[int]:
    """The scripted prompt token ids of a request's messages."""
    text = json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return list(hashlib.sha256(text.encode()).digest())


def add_capture(completion: dict[str, Any], body: Mapping[str, Any]) -> dict[str, Any] | None:
    """Put ids and logprobs into `completion` as asked; what was sent (None: nothing asked)."""
    ids, logprobs = body.get("return_token_ids") is True, body.get("logprobs") is True
    if not ids and not logprobs:
        return None
    choice = completion["choices"][0]
    generated = _generated_text(choice["message"]).encode()
    token_ids = list(generated)
    sent: dict[str, Any] = {}
    if ids:
        completion["prompt_token_ids"] = sent["prompt_token_ids"] = prompt_ids(body["messages"])
        choice["token_ids"] = sent["token_ids"] = token_ids
    if logprobs:
        values = [-((i * 7) % 10 + 1) / 10 for i in range(len(token_ids))]
        content = [
            {"token": chr(b), "logprob": v, "bytes": [b], "top_logprobs": []}
            for b, v in zip(token_ids, values, strict=True)
        ]
        choice["logprobs"] = {"content": content}
        sent["logprobs"] = values
    return sent


def spread(chunks: list[dict[str, Any]], completion: Mapping[str, Any]) -> None:
    """Streamed: prompt ids on the first chunk, ids and logprobs shared among the deltas."""
    if "prompt_token_ids" in completion and chunks:
        chunks[0]["prompt_token_ids"] = completion["prompt_token_ids"]
    choice = completion["choices"][0]
    deltas = [c for c in chunks if c.get("choices")][:-1] or chunks[:1]  # not the finish chunk
    ids: Sequence[int] | None = choice.get("token_ids")
    logprobs = choice.get("logprobs")
    entries: Sequence[Any] | None = logprobs.get("content") if logprobs else None
    for n, chunk in enumerate(deltas):
        part = chunk["choices"][0]
        if ids is not None:
            part["token_ids"] = list(_share(ids, n, len(deltas)))
        if entries is not None:
            part["logprobs"] = {"content": list(_share(entries, n, len(deltas)))}


def _share(values: Sequence[Any], n: int, parts: int) -> Sequence[Any]:
    size = -(-len(values) // parts)
    return values[n * size : (n + 1) * size]


def _generated_text(message: Mapping[str, Any]) -> str:
    """What the scripted model 'sampled': its reasoning, text and tool calls, as JSON."""
    calls = message.get("tool_calls") or []
    parts = [message.get("reasoning_content") or "", message.get("content") or ""]
    return "".join(parts) + (json.dumps(calls, sort_keys=True) if calls else "")
