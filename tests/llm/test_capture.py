"""Token capture (`llm.capture`) against the scripted server's vLLM-style answers, streamed
and not: the ids and logprobs the model client returns are exactly what the server sent,
the exact request is kept, the session header arrives, and a server that refuses
`return_token_ids` is asked again without it (logprobs only)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.agent.types import Completion
from app.domain.rollout_capture import Compactor, rebuild
from app.errors import LLMError
from app.llm.openai import OpenAIChatModel
from app.llm.token_continuous import TokenContinuousModel
from app.scripted import Script, ScriptedLLMServer, Turn
from app.scripted.tokens import prompt_ids
from tests.llm.support import TOOLS, USER, planned_server, register


def captured(completion: Completion) -> dict[str, object]:
    assert completion.capture is not None
    return dict(completion.capture)


@pytest.mark.parametrize("stream", [False, True])
async def test_ids_and_logprobs_are_what_the_server_sent(
    llm_server: ScriptedLLMServer, stream: bool
) -> None:
    turns = [Turn("execute_bash", {"command": "echo hi"}, content="Let me look.", reasoning="r")]
    name = register(llm_server, Script(turns))
    model = OpenAIChatModel(
        base_url=llm_server.base_url,
        api_key="k",
        model=name,
        capture=True,
        stream=stream,
        extra_headers={"X-Session-Id": "task_abc"},
    )
    try:
        deltas: list[str] = []

        async def on_delta(kind: str, text: str) -> None:
            deltas.append(text)

        completion = await model.complete(USER, TOOLS, on_delta)
    finally:
        await model.aclose()
    assert bool(deltas) is stream  # really streamed (or not)
    (sent,) = llm_server.sent(name)
    got = captured(completion)
    assert got["token_ids"] == sent["token_ids"]
    assert got["token_ids"]
    assert got["prompt_token_ids"] == sent["prompt_token_ids"] == prompt_ids(USER)
    assert got["logprobs"] == sent["logprobs"]
    assert len(got["logprobs"]) == len(got["token_ids"])  # type: ignore[arg-type]
    assert got["request"] == USER
    assert got["tools"] == TOOLS
    assert got["response"] == completion.message
    assert got["finish_reason"] == "tool_calls"
    assert sent["session"] == "task_abc"
    body = llm_server.last_request(name)
    assert body is not None
    assert body["logprobs"] is True
    assert body["return_token_ids"] is True


async def test_no_capture_asks_for_nothing(llm_server: ScriptedLLMServer) -> None:
    name = register(llm_server, Script([Turn("submit", {})]))
    model = OpenAIChatModel(base_url=llm_server.base_url, api_key="", model=name, stream=False)
    try:
        completion = await model.complete(USER, TOOLS)
    finally:
        await model.aclose()
    assert completion.capture is None
    body = llm_server.last_request(name)
    assert body is not None
    assert "logprobs" not in body
    assert "return_token_ids" not in body
    assert llm_server.sent(name) == []


async def test_a_conversation_is_stored_as_deltas_and_rebuilt_exactly(
    llm_server: ScriptedLLMServer,
) -> None:
    turns = [Turn("execute_bash", {"command": "ls"}), Turn("submit", {})]
    name = register(llm_server, Script(turns))
    model = OpenAIChatModel(
        base_url=llm_server.base_url, api_key="", model=name, capture=True, stream=False
    )
    history = [dict(m) for m in USER]
    history[-1]["content"] += "\nSteps Remaining: 2"
    compactor, stored = Compactor(), []
    try:
        for index in range(2):
            completion = await model.complete(history, TOOLS)
            stored.append((index, compactor.compact(captured(completion))))
            history.append(completion.message)
            history.append({"role": "tool", "tool_call_id": f"call_{index}", "content": "ok"})
            history[-1]["content"] += "\nSteps Remaining: 1"
    finally:
        await model.aclose()
    assert stored[0][1]["messages_from"] == 0
    assert "tools" in stored[0][1]
    assert stored[1][1]["messages_from"] == 3  # system, user, answer: only the tool reply is new
    assert [m["role"] for m in stored[1][1]["messages"]] == ["tool"]
    assert "tools" not in stored[1][1]
    rollout = rebuild(stored)
    assert rollout.messages == history[:-1]  # the last tool reply was never sent
    assert rollout.generated == [False, False, True, False, True]
    assert rollout.tools == TOOLS
    sent = llm_server.sent(name)
    for turn, answer in zip(rollout.turns, sent, strict=True):
        request = rollout.messages[: turn["request_messages"]]
        assert turn["prompt_token_ids"] == prompt_ids(request) == answer["prompt_token_ids"]
        assert turn["completion_token_ids"] == answer["token_ids"]
        assert turn["logprobs"] == answer["logprobs"]


async def test_a_server_refusing_token_ids_is_asked_again_for_logprobs_only() -> None:
    refusal = json.dumps({"error": {"message": "Unrecognized argument: return_token_ids"}})
    answer = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "ok"},
                "logprobs": {"content": [{"token": "ok", "logprob": -0.25}]},
            }
        ]
    }

    async def refuse(_body: dict[str, Any]) -> tuple[int, str, bytes]:
        return 400, "application/json", refusal.encode()

    async def reply(_body: dict[str, Any]) -> tuple[int, str, bytes]:
        return 200, "application/json", json.dumps(answer).encode()

    async with planned_server([refuse, reply]) as (url, seen):
        model = OpenAIChatModel(
            base_url=url, api_key="", model="m", capture=True, stream=False, max_retries=0
        )
        try:
            completion = await model.complete(USER, TOOLS)
        finally:
            await model.aclose()
    first, second = seen.bodies
    assert first["return_token_ids"] is True
    assert "return_token_ids" not in second
    assert second["logprobs"] is True
    got = captured(completion)
    assert got["logprobs"] == [-0.25]
    assert got["token_ids"] is None
    assert got["prompt_token_ids"] is None


async def test_llama_cpps_ids_in_its_logprob_entries_are_the_completion_ids() -> None:
    """llama.cpp ignores `return_token_ids` but names each sampled token's `id` in its
    logprob entry: those are the completion's ids (no prompt ids: it sends none)."""
    answer = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "ok!"},
                "logprobs": {
                    "content": [
                        {"id": 566, "token": "ok", "logprob": -0.25, "bytes": [111, 107]},
                        {"id": 17, "token": "!", "logprob": -1.5, "bytes": [33]},
                    ]
                },
            }
        ]
    }

    async def reply(_body: dict[str, Any]) -> tuple[int, str, bytes]:
        return 200, "application/json", json.dumps(answer).encode()

    async with planned_server([reply]) as (url, _seen):
        model = OpenAIChatModel(
            base_url=url, api_key="", model="m", capture=True, stream=False, max_retries=0
        )
        try:
            got = captured(await model.complete(USER, TOOLS))
        finally:
            await model.aclose()
    assert got["token_ids"] == [566, 17]
    assert got["logprobs"] == [-0.25, -1.5]
    assert got["prompt_token_ids"] is None


async def test_token_continuous_mode_names_what_a_server_without_a_template_lacks(
    llm_server: ScriptedLLMServer,
) -> None:
    """The scripted server speaks chat completions only: the token-continuous client fails
    the first call with an error naming the route it needs, after no retry (a 404 heals
    nothing)."""
    model = TokenContinuousModel(
        base_url=llm_server.base_url, api_key="k", model="m", max_retries=3, backoff_s=0.01
    )
    try:
        with pytest.raises(
            LLMError, match=r"needs the server.s /apply-template .*: /apply-template: .*HTTP 404"
        ) as failed:
            await model.complete([{"role": "user", "content": USER}], TOOLS)
    finally:
        await model.aclose()
    assert failed.value.details["attempts"] == 1
