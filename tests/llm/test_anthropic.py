"""AnthropicChatModel against the scripted server's Messages API face (`/v1/messages`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from app.errors import LLMError
from app.llm.anthropic import AnthropicChatModel
from app.llm.anthropic_wire import ANTHROPIC_CONTENT, NOT_RUN
from app.scripted import Script, ScriptedLLMServer, Turn, prompt_tokens_of
from tests.llm.support import TOOLS, USER, raw_http_server, register

ModelFactory = Callable[..., AnthropicChatModel]
THINK = Turn(
    tool="execute_bash",
    arguments={"command": "python3 -c 'print(6*7)'"},
    content="I will compute it.",
    reasoning="Six sevens. Let me check with Python.",
)


@pytest.fixture
async def make_model(llm_server: ScriptedLLMServer) -> AsyncIterator[ModelFactory]:
    made: list[AnthropicChatModel] = []

    def make(**overrides: Any) -> AnthropicChatModel:
        options: dict[str, Any] = {
            "base_url": llm_server.base_url,
            "api_key": "sk-ant-test",
            "model": "unset",
            "temperature": 0.7,
            "max_tokens": 4096,
            "max_retries": 2,
            "backoff_s": 0.01,
        }
        options.update(overrides)
        model = AnthropicChatModel(**options)
        made.append(model)
        return model

    yield make
    for model in made:
        await model.aclose()


def answer(message: dict[str, Any], call_id: str, text: str) -> list[dict[str, Any]]:
    return [*USER, message, {"role": "tool", "tool_call_id": call_id, "content": text}]


async def test_tool_use_thinking_and_usage(
    llm_server: ScriptedLLMServer, make_model: ModelFactory
) -> None:
    name = register(llm_server, Script([THINK, Turn(tool="submit", expect="42")]))
    model = make_model(model=name)

    first = await model.complete(USER, TOOLS)

    assert first.content == "I will compute it."
    assert first.reasoning == "Six sevens. Let me check with Python."
    (call,) = first.tool_calls
    assert (call.id, call.name) == ("toolu_scripted_0", "execute_bash")
    assert call.arguments == {"command": "python3 -c 'print(6*7)'"}
    assert first.prompt_tokens > 0
    assert first.completion_tokens > 0
    body = llm_server.last_request(name)
    assert body is not None
    assert body["system"] == "You are an agent."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Compute 6*7."}]}
    ]
    assert [t["name"] for t in body["tools"]] == ["execute_bash", "str_replace_editor", "submit"]
    assert body["tools"][0]["input_schema"] == {"type": "object"}
    assert (body["max_tokens"], body["temperature"]) == (4096, 0.7)
    headers = llm_server.last_headers(name)
    assert headers is not None
    assert headers["x-api-key"] == "sk-ant-test"
    assert headers["anthropic-version"] == "2023-06-01"

    # Turn 2: the server refuses unless the thinking block comes back exactly as it was sent.
    second = await model.complete(answer(first.message, call.id, "42\n"), TOOLS)

    assert [c.name for c in second.tool_calls] == ["submit"]
    sent = llm_server.last_request(name)
    assert sent is not None
    assert sent["messages"][1] == {"role": "assistant", "content": first.message[ANTHROPIC_CONTENT]}
    assert sent["messages"][2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "42\n"}],
    }
    assert [f for f in llm_server.failures if f.startswith(name)] == []


async def test_the_server_refuses_thinking_that_was_not_sent_back(
    llm_server: ScriptedLLMServer, make_model: ModelFactory
) -> None:
    """The check above can fail: a history without the original blocks is refused."""
    name = register(llm_server, Script([THINK, Turn(tool="submit")]))
    model = make_model(model=name)
    first = await model.complete(USER, TOOLS)
    stripped = {k: v for k, v in first.message.items() if k != ANTHROPIC_CONTENT}

    with pytest.raises(LLMError, match="thinking blocks must be passed back unmodified"):
        await model.complete(answer(stripped, first.tool_calls[0].id, "42"), TOOLS)


async def test_streaming_hands_out_deltas_and_assembles_the_same_answer(
    llm_server: ScriptedLLMServer, make_model: ModelFactory
) -> None:
    name = register(llm_server, Script([THINK], repeat_last=True))
    model = make_model(model=name)
    deltas: list[tuple[str, str]] = []

    async def on_delta(kind: str, fragment: str) -> None:
        deltas.append((kind, fragment))

    streamed = await model.complete(USER, TOOLS, on_delta=on_delta)
    plain = await model.complete(USER, TOOLS)

    body = llm_server.last_request(name)
    assert body is not None
    assert "stream" not in body
    assert len(deltas) > 2
    assert "".join(f for k, f in deltas if k == "reasoning") == THINK.reasoning
    assert "".join(f for k, f in deltas if k == "text") == THINK.content
    assert streamed == plain  # content, reasoning, tool calls, usage and history message


async def test_unanswered_parallel_tool_uses_get_a_not_run_result(
    llm_server: ScriptedLLMServer, make_model: ModelFactory
) -> None:
    second_call = {
        "id": "toolu_extra",
        "type": "function",
        "function": {"name": "execute_bash", "arguments": '{"command": "date"}'},
    }
    turns = [Turn(tool="execute_bash", arguments={"command": "ls"}, extra_calls=[second_call])]
    name = register(llm_server, Script([*turns, Turn(tool="submit")]))
    model = make_model(model=name)
    first = await model.complete(USER, TOOLS)
    assert [c.id for c in first.tool_calls] == ["toolu_scripted_0", "toolu_extra"]

    # The loop (reference policy) answers only the first id and adds a user message.
    history = answer(first.message, "toolu_scripted_0", "file.txt")
    history.append({"role": "user", "content": "Steps Remaining: 3"})
    await model.complete(history, TOOLS)

    sent = llm_server.last_request(name)
    assert sent is not None
    assert sent["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_scripted_0", "content": "file.txt"},
        {"type": "tool_result", "tool_use_id": "toolu_extra", "content": NOT_RUN, "is_error": True},
        {"type": "text", "text": "Steps Remaining: 3"},
    ]
    assert [f for f in llm_server.failures if f.startswith(name)] == []


async def test_thinking_through_extra_body_drops_the_temperature(
    llm_server: ScriptedLLMServer, make_model: ModelFactory
) -> None:
    name = register(llm_server, Script([Turn(tool="submit")]))
    thinking = {"type": "enabled", "budget_tokens": 2048}
    model = make_model(model=name, extra_body={"thinking": thinking, "system": "hijack"})
    await model.complete(USER, TOOLS)
    body = llm_server.last_request(name)
    assert body is not None
    assert body["thinking"] == thinking
    assert "temperature" not in body
    assert body["system"] == "You are an agent."  # extra_body cannot replace the prompt


async def test_overloaded_is_retried_and_a_bad_request_is_not(
    llm_server: ScriptedLLMServer, make_model: ModelFactory
) -> None:
    flaky = register(llm_server, Script([Turn(tool="submit")], fail_status=529, fail_count=2))
    completion = await make_model(model=flaky).complete(USER, TOOLS)
    assert completion.tool_calls[0].name == "submit"
    assert llm_server.requests[flaky] == 3

    broken = register(llm_server, Script([Turn(tool="submit")], fail_status=400))
    with pytest.raises(LLMError, match=r"HTTP 400: .*scripted failure 400.*after 1 attempt"):
        await make_model(model=broken).complete(USER, TOOLS)
    assert llm_server.requests[broken] == 1


async def test_context_limit_errors_shrink_max_tokens(
    llm_server: ScriptedLLMServer, make_model: ModelFactory
) -> None:
    name = register(llm_server, Script([Turn(tool="submit")], context_window=30000))
    model = make_model(model=name, max_tokens=64000, max_retries=0)
    await model.complete(USER, TOOLS)
    body = llm_server.last_request(name)
    assert body is not None
    assert body["max_tokens"] == 30000 - prompt_tokens_of(body) - 100
    assert llm_server.requests[name] == 2


async def test_a_malformed_answer_is_an_llm_error_not_a_crash(make_model: ModelFactory) -> None:
    async with raw_http_server(200, b'{"type": "message"}', "application/json") as url:
        model = make_model(base_url=url, model="m")
        with pytest.raises(LLMError, match="malformed message"):
            await model.complete(USER, TOOLS)
