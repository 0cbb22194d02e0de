"""OpenAIChatModel against a real scripted server (and raw loopback servers for bad answers)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from app.errors import LLMError
from app.llm.openai import OpenAIChatModel, parse_completion, parse_retry_after, retry_delay
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.llm.support import TOOLS, USER, closed_port, raw_http_server, register

ModelFactory = Callable[..., OpenAIChatModel]


@pytest.fixture
async def make_model(llm_server: ScriptedLLMServer) -> AsyncIterator[ModelFactory]:
    """Build models pointed at the test server by default; close them all afterwards."""
    made: list[OpenAIChatModel] = []

    def make(**overrides: object) -> OpenAIChatModel:
        options: dict[str, object] = {
            "base_url": llm_server.base_url + "/",
            "api_key": "",
            "model": "unset",
            "temperature": 0.7,
            "max_tokens": 512,
            "max_retries": 2,
            "backoff_s": 0.01,
        }
        options.update(overrides)
        model = OpenAIChatModel(**options)  # type: ignore[arg-type]
        made.append(model)
        return model

    yield make
    for model in made:
        await model.aclose()


async def test_tool_call_content_reasoning_and_usage(
    llm_server: ScriptedLLMServer, make_model: ModelFactory
) -> None:
    turns = [
        Turn(
            tool="execute_bash",
            arguments={"command": "python3 -c 'print(6*7)'"},
            content="I will compute it.",
            reasoning="Multiplication is easy.",
        ),
        Turn(tool="submit", expect="42"),
    ]
    name = register(llm_server, Script(turns=turns))
    model = make_model(model=name)

    first = await model.complete(USER, TOOLS)

    assert first.content == "I will compute it."
    assert first.reasoning == "Multiplication is easy."
    (call,) = first.tool_calls
    assert call.name == "execute_bash"
    assert call.id == "call_0"
    assert call.arguments == {"command": "python3 -c 'print(6*7)'"}
    assert json.loads(call.raw_arguments) == call.arguments
    assert first.prompt_tokens > 0
    assert first.completion_tokens > 0
    assert first.message["role"] == "assistant"
    assert first.message["reasoning_content"] == "Multiplication is easy."
    assert first.message["tool_calls"][0]["function"]["name"] == "execute_bash"

    history = [*USER, first.message, {"role": "tool", "tool_call_id": call.id, "content": "42\n"}]
    second = await model.complete(history, TOOLS)

    assert [c.name for c in second.tool_calls] == ["submit"]
    assert second.tool_calls[0].arguments == {}
    assert second.content == ""
    assert "content" not in second.message, "None values are dropped from the history message"
    assert llm_server.requests[name] == 2
    assert llm_server.failures == []


async def test_plain_text_answer_has_no_tool_calls(
    llm_server: ScriptedLLMServer, make_model: ModelFactory
) -> None:
    name = register(llm_server, Script(turns=[Turn(content="Just text.")]))

    completion = await make_model(model=name).complete(USER, TOOLS)

    assert completion.tool_calls == ()
    assert completion.content == "Just text."
    assert completion.reasoning == ""
    assert "tool_calls" not in completion.message


@pytest.mark.parametrize("raw", ['{"command": "ls"', "[1, 2]", "not json"])
async def test_malformed_arguments_keep_raw_text(
    llm_server: ScriptedLLMServer, make_model: ModelFactory, raw: str
) -> None:
    name = register(llm_server, Script(turns=[Turn(tool="execute_bash", arguments=raw)]))

    completion = await make_model(model=name).complete(USER, TOOLS)

    (call,) = completion.tool_calls
    assert call.name == "execute_bash"
    assert call.arguments is None
    assert call.raw_arguments == raw


async def test_expect_mismatch_records_failure_and_is_not_retried(
    llm_server: ScriptedLLMServer, make_model: ModelFactory
) -> None:
    name = register(llm_server, Script(turns=[Turn(tool="submit", expect="needle")]))
    before = len(llm_server.failures)

    with pytest.raises(LLMError) as caught:
        await make_model(model=name).complete(USER, TOOLS)

    assert "409" in caught.value.message
    assert "needle" in caught.value.message
    assert llm_server.requests[name] == 1
    new = llm_server.failures[before:]
    assert len(new) == 1
    assert "needle" in new[0]


async def test_server_error_retried_then_raised(
    llm_server: ScriptedLLMServer, make_model: ModelFactory
) -> None:
    name = register(llm_server, Script(turns=[], fail_status=500))

    with pytest.raises(LLMError) as caught:
        await make_model(model=name, max_retries=3).complete(USER, TOOLS)

    assert llm_server.requests[name] == 4
    message = caught.value.message
    assert "HTTP 500" in message
    assert "4 attempt(s)" in message
    assert "scripted failure" in message, "an excerpt of the body is included"
    assert caught.value.details == {
        "endpoint": llm_server.base_url + "/chat/completions",
        "status": 500,
        "attempts": 4,
    }


async def test_client_error_not_retried(
    llm_server: ScriptedLLMServer, make_model: ModelFactory
) -> None:
    with pytest.raises(LLMError) as caught:
        await make_model(model="no-such-model", max_retries=3).complete(USER, TOOLS)

    assert "HTTP 404" in caught.value.message
    assert "1 attempt(s)" in caught.value.message
    assert llm_server.requests["no-such-model"] == 1


async def test_unreachable_endpoint_fails_fast(make_model: ModelFactory) -> None:
    port = closed_port()
    started = time.monotonic()

    with pytest.raises(LLMError) as caught:
        await make_model(base_url=f"http://127.0.0.1:{port}/v1", max_retries=2).complete(
            USER, TOOLS
        )

    assert time.monotonic() - started < 20  # bounded: no 1200 s connect wait
    assert "unreachable" in caught.value.message
    assert "3 attempt(s)" in caught.value.message
    assert f"127.0.0.1:{port}" in caught.value.message


async def test_request_body_and_headers(
    llm_server: ScriptedLLMServer, make_model: ModelFactory
) -> None:
    name = register(llm_server, Script(turns=[Turn(content="ok")]), prefix="gpt-test")
    extra = {"chat_template_kwargs": {"thinking": True}, "top_p": 0.5}

    await make_model(model=name, api_key="sk-test", extra_body=extra).complete(USER, TOOLS)

    body = llm_server.last_request(name)
    assert body is not None
    assert body["model"] == name
    assert body["messages"] == USER
    assert [t["function"]["name"] for t in body["tools"]] == [
        "execute_bash",
        "str_replace_editor",
        "submit",
    ]
    assert body["temperature"] == 0.7
    assert body["max_tokens"] == 512
    assert body["chat_template_kwargs"] == {"thinking": True}
    assert body["top_p"] == 0.5
    assert "tool_choice" not in body
    assert "stream" not in body
    headers = llm_server.last_headers(name)
    assert headers is not None
    assert headers["authorization"] == "Bearer sk-test"


async def test_no_key_no_authorization_and_none_options_omitted(
    llm_server: ScriptedLLMServer, make_model: ModelFactory
) -> None:
    name = register(llm_server, Script(turns=[Turn(content="ok")]))

    await make_model(model=name, temperature=None, max_tokens=None).complete(USER, TOOLS)

    body = llm_server.last_request(name)
    assert body is not None
    assert "temperature" not in body
    assert "max_tokens" not in body
    headers = llm_server.last_headers(name)
    assert headers is not None
    assert "authorization" not in headers


@pytest.mark.parametrize("prefix", ["o3-mini", "openai/o4-mini"])
async def test_temperature_omitted_for_o3_and_o4(
    llm_server: ScriptedLLMServer, make_model: ModelFactory, prefix: str
) -> None:
    name = register(llm_server, Script(turns=[Turn(content="ok")]), prefix=prefix)

    await make_model(model=name, temperature=1.0).complete(USER, TOOLS)

    body = llm_server.last_request(name)
    assert body is not None
    assert "temperature" not in body
    assert body["max_tokens"] == 512


async def test_retry_after_honoured_on_429(
    llm_server: ScriptedLLMServer, make_model: ModelFactory
) -> None:
    script = Script(
        turns=[Turn(content="after the wait")], fail_status=429, fail_count=1, retry_after_s=1
    )
    name = register(llm_server, script)
    started = time.monotonic()

    completion = await make_model(model=name, backoff_s=0.0).complete(USER, TOOLS)

    assert time.monotonic() - started >= 0.9
    assert completion.content == "after the wait"
    assert llm_server.requests[name] == 2


async def test_429_without_retry_after_uses_backoff(
    llm_server: ScriptedLLMServer, make_model: ModelFactory
) -> None:
    name = register(llm_server, Script(turns=[Turn(content="ok")], fail_status=429, fail_count=2))
    started = time.monotonic()

    completion = await make_model(model=name, backoff_s=0.2).complete(USER, TOOLS)

    assert time.monotonic() - started >= 0.55, "0.2 s then 0.4 s"
    assert completion.content == "ok"
    assert llm_server.requests[name] == 3


async def test_non_json_answer_is_a_protocol_error(make_model: ModelFactory) -> None:
    async with raw_http_server(200, b"<html>hello</html>", "text/html") as base_url:
        with pytest.raises(LLMError) as caught:
            await make_model(base_url=base_url, max_retries=3).complete(USER, TOOLS)

    assert "not JSON" in caught.value.message
    assert "<html>hello</html>" in caught.value.message
    assert "1 attempt(s)" in caught.value.message


async def test_answer_without_choices_is_a_protocol_error(make_model: ModelFactory) -> None:
    async with raw_http_server(200, b'{"choices": []}', "application/json") as base_url:
        with pytest.raises(LLMError) as caught:
            await make_model(base_url=base_url).complete(USER, TOOLS)

    assert "malformed chat completion" in caught.value.message


async def test_api_key_never_in_error_message(make_model: ModelFactory) -> None:
    body = b'{"error": {"message": "Incorrect API key provided: sk-very-secret"}}'
    async with raw_http_server(401, body, "application/json") as base_url:
        with pytest.raises(LLMError) as caught:
            await make_model(base_url=base_url, api_key="sk-very-secret").complete(USER, TOOLS)

    assert "HTTP 401" in caught.value.message
    assert "sk-very-secret" not in caught.value.message
    assert "sk-very-secret" not in str(caught.value.details)


async def test_aclose_closes_only_its_own_client(llm_server: ScriptedLLMServer) -> None:
    name = register(llm_server, Script(turns=[Turn(content="ok")]))
    async with httpx.AsyncClient() as shared:
        borrowed = OpenAIChatModel(
            base_url=llm_server.base_url,
            api_key="",
            model=name,
            temperature=None,
            max_tokens=None,
            client=shared,
        )
        await borrowed.aclose()
        assert not shared.is_closed
        assert (await borrowed.complete(USER, TOOLS)).content == "ok"

    owned = OpenAIChatModel(
        base_url=llm_server.base_url, api_key="", model=name, temperature=None, max_tokens=None
    )
    await owned.aclose()
    with pytest.raises(RuntimeError):
        await owned.complete(USER, TOOLS)


def test_retry_delay_grows_and_is_capped() -> None:
    assert [retry_delay(n, 1.0, None) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert retry_delay(10, 1.0, None) == 30.0
    assert retry_delay(1, 1.0, 5.0) == 5.0
    assert retry_delay(1, 1.0, 3600.0) == 60.0


def test_parse_retry_after_forms() -> None:
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("nan") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


def test_parse_completion_variants() -> None:
    data = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    "reasoning": "thinking",
                    "tool_calls": [
                        {"id": "x", "function": {"name": "submit", "arguments": {"k": 1}}}
                    ],
                    "refusal": None,
                }
            }
        ]
    }

    completion = parse_completion(data)

    assert completion.content == "ab"
    assert completion.reasoning == "thinking"
    assert completion.tool_calls[0].arguments == {"k": 1}
    assert json.loads(completion.tool_calls[0].raw_arguments) == {"k": 1}
    assert "refusal" not in completion.message
    assert (completion.prompt_tokens, completion.completion_tokens) == (0, 0)


def test_empty_tool_calls_dropped_from_history() -> None:
    data = {"choices": [{"message": {"content": "hi", "tool_calls": []}}], "usage": {}}

    completion = parse_completion(data)

    assert completion.message == {"content": "hi", "role": "assistant"}
    assert completion.tool_calls == ()
