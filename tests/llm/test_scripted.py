"""The scripted OpenAI-compatible server, spoken to over plain HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from typing import Any

import httpx
import pytest

from app.scripted import (
    DEMO_ANSWER,
    DEMO_PROMPT,
    DEMO_SCRIPT,
    EXHAUSTED,
    Script,
    ScriptedLLMServer,
    Turn,
)
from tests.llm.support import TOOLS, USER, closed_port, register


async def chat(
    server: ScriptedLLMServer, model: str, messages: list[Any], **extra: Any
) -> httpx.Response:
    body = {"model": model, "messages": messages, "tools": TOOLS, **extra}
    async with httpx.AsyncClient() as client:
        return await client.post(f"{server.base_url}/chat/completions", json=body)


def assistant(n: int) -> list[dict[str, Any]]:
    """A history with n assistant turns, each answered by a tool message."""
    history: list[dict[str, Any]] = list(USER)
    for i in range(n):
        history.append({"role": "assistant", "content": f"turn {i}"})
        history.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"result {i}"})
    return history


async def test_turn_index_is_the_number_of_assistant_messages(
    llm_server: ScriptedLLMServer,
) -> None:
    turns = [Turn(tool="execute_bash", arguments={"command": f"echo {i}"}) for i in range(3)]
    name = register(llm_server, Script(turns=turns))

    answers = [(await chat(llm_server, name, assistant(n))).json() for n in (2, 0, 1)]

    calls = [a["choices"][0]["message"]["tool_calls"][0] for a in answers]
    assert [c["id"] for c in calls] == ["call_2", "call_0", "call_1"]
    assert [json.loads(c["function"]["arguments"])["command"] for c in calls] == [
        "echo 2",
        "echo 0",
        "echo 1",
    ]
    assert all(c["type"] == "function" for c in calls)
    assert all(a["choices"][0]["finish_reason"] == "tool_calls" for a in answers)


async def test_completion_shape(llm_server: ScriptedLLMServer) -> None:
    name = register(llm_server, Script(turns=[Turn(content="hello", reasoning="hmm")]))

    response = await chat(llm_server, name, USER)

    assert response.status_code == 200
    data = response.json()
    assert data["object"] == "chat.completion"
    assert data["model"] == name
    assert isinstance(data["id"], str)
    assert isinstance(data["created"], int)
    choice = data["choices"][0]
    assert choice["index"] == 0
    assert choice["finish_reason"] == "stop"
    assert choice["message"] == {
        "role": "assistant",
        "content": "hello",
        "reasoning_content": "hmm",
    }
    usage = data["usage"]
    assert usage["prompt_tokens"] == len(json.dumps(USER)) // 4
    assert 0 < usage["completion_tokens"] < 10
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_string_arguments_sent_verbatim(llm_server: ScriptedLLMServer) -> None:
    name = register(llm_server, Script(turns=[Turn(tool="execute_bash", arguments="{oops")]))

    data = (await chat(llm_server, name, USER)).json()

    assert data["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == "{oops"


async def test_past_the_end_says_exhausted(llm_server: ScriptedLLMServer) -> None:
    name = register(llm_server, Script(turns=[Turn(tool="submit")]))

    data = (await chat(llm_server, name, assistant(1))).json()

    message = data["choices"][0]["message"]
    assert message["content"] == EXHAUSTED
    assert "tool_calls" not in message
    assert data["choices"][0]["finish_reason"] == "stop"


async def test_repeat_last_keeps_replaying(llm_server: ScriptedLLMServer) -> None:
    turns = [Turn(content="first"), Turn(tool="execute_bash", arguments={"command": "sleep 1"})]
    name = register(llm_server, Script(turns=turns, repeat_last=True))

    data = (await chat(llm_server, name, assistant(7))).json()

    call = data["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "execute_bash"
    assert call["id"] == "call_7"


async def test_unknown_model_is_404_openai_style(llm_server: ScriptedLLMServer) -> None:
    response = await chat(llm_server, "never-registered", USER)

    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found"
    assert "never-registered" in error["message"]


async def test_expect_checks_newest_tool_or_user_message(llm_server: ScriptedLLMServer) -> None:
    turns = [Turn(content="a"), Turn(tool="submit", expect="result 0")]
    name = register(llm_server, Script(turns=turns))
    before = len(llm_server.failures)

    ok = await chat(llm_server, name, assistant(1))
    history = [*assistant(1), {"role": "user", "content": "a nudge"}]
    bad = await chat(llm_server, name, history)

    assert ok.status_code == 200
    assert bad.status_code == 409
    assert "result 0" in bad.json()["error"]["message"]
    new = llm_server.failures[before:]
    assert len(new) == 1
    assert "a nudge" in new[0]


async def test_missing_tool_schemas_recorded(llm_server: ScriptedLLMServer) -> None:
    name = register(llm_server, Script(turns=[Turn(content="ok")]))
    before = len(llm_server.failures)

    response = await chat(llm_server, name, USER, tools=TOOLS[:1])

    assert response.status_code == 200
    new = llm_server.failures[before:]
    assert len(new) == 1
    assert "str_replace_editor" in new[0]
    assert "submit" in new[0]


async def test_fail_status_and_fail_count(llm_server: ScriptedLLMServer) -> None:
    script = Script(turns=[Turn(content="ok")], fail_status=503, fail_count=2, retry_after_s=3)
    name = register(llm_server, script)

    statuses = [(await chat(llm_server, name, USER)) for _ in range(3)]

    assert [r.status_code for r in statuses] == [503, 503, 200]
    assert statuses[0].headers["retry-after"] == "3"
    assert llm_server.requests[name] == 3


async def test_delay_before_answering(llm_server: ScriptedLLMServer) -> None:
    name = register(llm_server, Script(turns=[Turn(content="slow", delay_s=0.3)]))
    started = time.monotonic()

    response = await chat(llm_server, name, USER)

    assert response.status_code == 200
    assert time.monotonic() - started >= 0.3


async def test_models_lists_scripts(llm_server: ScriptedLLMServer) -> None:
    name = register(llm_server, Script(turns=[]))

    async with httpx.AsyncClient() as client:
        data = (await client.get(f"{llm_server.base_url}/models")).json()

    assert data["object"] == "list"
    assert name in [m["id"] for m in data["data"]]


async def test_bad_json_body_is_400(llm_server: ScriptedLLMServer) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{llm_server.base_url}/chat/completions", content=b"{")

    assert response.status_code == 400


def test_lifecycle_start_stop() -> None:
    server = ScriptedLLMServer({"m": Script(turns=[Turn(content="hi")])}, port=closed_port())
    with pytest.raises(RuntimeError):
        _ = server.base_url

    with server:
        base_url = server.base_url
        reply = httpx.post(
            f"{base_url}/chat/completions", json={"model": "m", "messages": [], "tools": TOOLS}
        )
        assert reply.json()["choices"][0]["message"]["content"] == "hi"

    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{base_url}/models")
    server.stop()  # a second stop is harmless


def test_demo_script_is_a_complete_task() -> None:
    tools = [turn.tool for turn in DEMO_SCRIPT.turns]
    assert tools == ["execute_bash", "str_replace_editor", "submit"]
    bash, editor, _ = DEMO_SCRIPT.turns
    assert isinstance(bash.arguments, dict)
    assert "python3" in bash.arguments["command"]
    assert editor.arguments == {
        "command": "create",
        "path": "/testbed/output/answer.txt",
        "file_text": "16796",
    }
    assert all("scripted demo" in turn.content.lower() for turn in DEMO_SCRIPT.turns)


def test_demo_command_prints_the_demo_answer() -> None:
    bash = DEMO_SCRIPT.turns[0]
    assert isinstance(bash.arguments, dict)

    result = subprocess.run(
        ["bash", "-c", bash.arguments["command"]], capture_output=True, text=True, check=True
    )

    assert result.stdout.strip() == DEMO_ANSWER
    assert DEMO_SCRIPT.turns[1].expect == DEMO_ANSWER


def test_demo_prompt_matches_the_script() -> None:
    assert "Catalan" in DEMO_PROMPT
    assert "/testbed/output/answer.txt" in DEMO_PROMPT
    assert "Catalan" in DEMO_SCRIPT.turns[0].content


def test_connections_have_nagle_off(llm_server: ScriptedLLMServer) -> None:
    """asyncio turns TCP_NODELAY on only for sockets whose proto is TCP; a listening socket
    made with proto 0 left every reused connection waiting ~40 ms (Nagle + delayed ACK),
    which inflated every scripted task and hid a per-request cost from the benchmarks."""
    server = llm_server._server
    assert server is not None
    (listener,) = [sock for srv in server.servers for sock in srv.sockets]
    assert listener.proto == socket.IPPROTO_TCP
    with httpx.Client(base_url=llm_server.base_url) as client:
        for _ in range(3):  # the same keep-alive connection, request after request
            assert client.get("/models").status_code == 200
