"""Token-continuous rollouts (`llm.tokens: "continuous"`) against llama.cpp: every turn's
prompt starts with the previous turn's prompt and completion token for token, at every
boundary, including after a tool call cut off by `max_tokens`; the first prompt is the
model's chat template rendered by the server; the export's flattened sequence and loss mask
add up to the turns; the model's `<tool_call>` text becomes the step's call. The same
task through the chat endpoint, for contrast, is measured in bench/real_llm.py."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import httpx

from app.config import Settings
from app.worker.pool import Worker
from tests.real_llm.conftest import RealServer
from tests.real_llm.test_real_llm import (  # noqa: F401 (fixtures)
    LIST_FILES,
    WORKER_WAIT_S,
    api,
    real_settings,
    submit,
    task_body,
)


async def export(api: httpx.AsyncClient, task_id: str) -> dict[str, Any]:  # noqa: F811
    response = await api.get(f"/v1/tasks/{task_id}/export")
    assert response.status_code == 200, response.text
    line: dict[str, Any] = json.loads(response.text)
    return line


def boundaries(turns: list[dict[str, Any]]) -> tuple[int, int]:
    """(boundaries where the next prompt continues prompt + completion, boundaries)."""
    kept = 0
    for before, after in itertools.pairwise(turns):
        sent = before["prompt_token_ids"] + before["completion_token_ids"]
        kept += after["prompt_token_ids"][: len(sent)] == sent
    return kept, len(turns) - 1


async def test_every_turn_continues_the_last_token_for_token(
    api: httpx.AsyncClient,  # noqa: F811
    real_settings: Settings,  # noqa: F811
    real_llm: RealServer,
) -> None:
    body = task_body(LIST_FILES, tokens="continuous")
    body["limits"]["max_steps"] = 4
    whole = await submit(api, body)
    cut = await submit(api, task_body(LIST_FILES, tokens="continuous", max_tokens_per_call=12))
    await asyncio.wait_for(Worker(real_settings).run(burst=True), WORKER_WAIT_S)

    line = await export(api, whole)
    assert line["status"] in ("succeeded", "failed"), line
    assert line["error"] is None or "llm" not in str(line["error"]).lower(), line
    turns = line["turns"]
    assert len(turns) >= 2, line
    assert boundaries(turns) == (len(turns) - 1, len(turns) - 1)
    calls = [t["tool_call"] for t in turns if t["tool_call"] is not None]
    assert calls, "the model's <tool_call> text is parsed into the step's call"
    assert calls[0]["tool"] == "execute_bash"

    # The first prompt is the chat template's rendering of the first request, as tokenized
    # by the server itself.
    root = real_llm.base_url.removesuffix("/v1")
    first = line["messages"][: turns[0]["request_messages"]]
    async with httpx.AsyncClient(timeout=60) as http:
        rendered = await http.post(
            f"{root}/apply-template", json={"messages": first, "tools": line["tools"]}
        )
        text = await http.post(f"{root}/detokenize", json={"tokens": turns[0]["prompt_token_ids"]})
    assert text.json()["content"] == rendered.json()["prompt"]

    # One sequence for the rollout: the last prompt and completion, the model's tokens masked 1.
    sequence = line["sequence"]
    assert line["sequence_break"] is None
    last = turns[-1]
    assert sequence["token_ids"] == last["prompt_token_ids"] + last["completion_token_ids"]
    assert sum(sequence["loss_mask"]) == sum(len(t["completion_token_ids"]) for t in turns)
    assert len(sequence["logprobs"]) == len(sequence["token_ids"])

    # A call cut off by max_tokens is the model's failure: the turn closes, the next continues.
    cut_line = await export(api, cut)
    assert (cut_line["status"], cut_line["finish_reason"]) == ("failed", "max_steps"), cut_line
    cut_turns = cut_line["turns"]
    assert [t["finish_reason"] for t in cut_turns] == ["length"] * len(cut_turns)
    assert all(t["tool_call"] is None for t in cut_turns)
    assert boundaries(cut_turns) == (len(cut_turns) - 1, len(cut_turns) - 1)
    assert cut_line["sequence"] is not None
