"""Tool calls in every shape servers send: parsed without crashing, sent back in standard form."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.llm.openai import OpenAIChatModel
from app.llm.tool_calls import parse_tool_call, parse_tool_calls
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.llm.support import TOOLS, USER, register


@pytest.mark.parametrize(
    ("raw", "name", "arguments"),
    [
        (  # the standard shape
            {"id": "c1", "type": "function", "function": {"name": "submit", "arguments": "{}"}},
            "submit",
            {},
        ),
        (  # name and arguments at the top level
            {"id": "c1", "name": "execute_bash", "arguments": '{"command": "ls"}'},
            "execute_bash",
            {"command": "ls"},
        ),
        (  # an object instead of JSON text (Ollama)
            {"id": "c1", "function": {"name": "execute_bash", "arguments": {"command": "ls"}}},
            "execute_bash",
            {"command": "ls"},
        ),
        (  # `parameters` instead of `arguments`
            {"id": "c1", "function": {"name": "execute_bash", "parameters": {"command": "ls"}}},
            "execute_bash",
            {"command": "ls"},
        ),
        (  # malformed JSON: no arguments, the raw text kept for the observation
            {"id": "c1", "function": {"name": "execute_bash", "arguments": '{"command": "ls'}},
            "execute_bash",
            None,
        ),
        ({"id": "c1", "function": {"name": "submit", "arguments": "[1]"}}, "submit", None),
        ("not a call at all", "", None),
    ],
)
def test_every_shape_parses(raw: Any, name: str, arguments: dict[str, Any] | None) -> None:
    call = parse_tool_call(raw)
    assert call.name == name
    assert call.arguments == arguments


def test_odd_calls_go_back_in_the_standard_shape_with_an_id() -> None:
    standard = {"id": "c1", "type": "function", "function": {"name": "submit", "arguments": "{}"}}
    top_level = {"name": "execute_bash", "arguments": {"command": "ls"}}
    calls, wire = parse_tool_calls([standard, top_level])
    assert [c.id for c in calls] == ["c1", "call_sandhive_1"]
    assert wire[0] is standard  # verbatim, as the reference package sends it back
    assert wire[1] == {
        "id": "call_sandhive_1",
        "type": "function",
        "function": {"name": "execute_bash", "arguments": json.dumps({"command": "ls"})},
    }
    assert parse_tool_calls(None) == ((), [])


async def test_a_server_with_top_level_and_broken_calls_does_not_fail_the_call(
    llm_server: ScriptedLLMServer,
) -> None:
    odd = [
        {"id": "x1", "type": "function", "name": "execute_bash", "arguments": '{"command": "ls"}'},
        {"type": "function", "function": {"name": "str_replace_editor", "arguments": "{oops"}},
    ]
    name = register(llm_server, Script([Turn(extra_calls=odd)]))
    model = OpenAIChatModel(
        base_url=llm_server.base_url, api_key="", model=name, temperature=None, max_tokens=None
    )
    try:
        completion = await model.complete(USER, TOOLS)
    finally:
        await model.aclose()
    first, second = completion.tool_calls
    assert (first.id, first.name, first.arguments) == ("x1", "execute_bash", {"command": "ls"})
    assert (second.id, second.name, second.arguments) == (
        "call_sandhive_1",
        "str_replace_editor",
        None,
    )
    assert second.raw_arguments == "{oops"
    assert [c["function"]["name"] for c in completion.message["tool_calls"]] == [
        "execute_bash",
        "str_replace_editor",
    ]
    assert all(c["id"] for c in completion.message["tool_calls"])
