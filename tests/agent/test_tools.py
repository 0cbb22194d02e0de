"""Tool schemas and dispatch: names, odd arguments, submit, unknown tools, the nudge."""

from __future__ import annotations

from typing import Any

import pytest

from app.agent.tools import (
    NAMELESS_CALL,
    NO_TOOL_CALL_NUDGE,
    ToolContext,
    ToolResult,
    is_no_call,
    run_tool,
    tool_schemas,
)
from app.agent.types import ToolCall
from app.sandbox import DockerSandbox

pytestmark = pytest.mark.asyncio(loop_scope="module")


def call(name: str, arguments: dict[str, Any] | None, raw: str = "") -> ToolCall:
    return ToolCall(id="call_9", name=name, arguments=arguments, raw_arguments=raw)


@pytest.mark.parametrize("profile", ["reference", "standard"])
async def test_schemas_offer_the_three_tools_in_the_package_order(profile: str) -> None:
    schemas = tool_schemas(profile)
    assert [s["type"] for s in schemas] == ["function"] * 3
    names = [s["function"]["name"] for s in schemas]
    assert names == ["str_replace_editor", "execute_bash", "submit"]
    editor, bash, submit = (s["function"]["parameters"] for s in schemas)
    assert editor["required"] == ["command", "path"]
    assert set(editor["properties"]) == {
        "command",
        "path",
        "file_text",
        "old_str",
        "new_str",
        "insert_line",
        "view_range",
    }
    assert editor["properties"]["insert_line"]["type"] == "integer"
    assert editor["properties"]["view_range"] == {
        **editor["properties"]["view_range"],
        "type": "array",
        "items": {"type": "integer"},
    }
    assert bash["required"] == ["command"]
    assert bash["properties"]["command"]["type"] == "string"
    assert submit == {"type": "object", "properties": {}, "required": []}


async def test_only_standard_offers_undo_edit() -> None:
    def commands(profile: str) -> list[str]:
        props = tool_schemas(profile)[0]["function"]["parameters"]["properties"]
        return list(props["command"]["enum"])

    assert commands("reference") == ["view", "create", "str_replace", "insert"]
    assert commands("standard") == ["view", "create", "str_replace", "insert", "undo_edit"]


async def test_unknown_profile_is_refused(box: DockerSandbox) -> None:
    with pytest.raises(ValueError, match="unknown tools profile"):
        tool_schemas("fancy")
    with pytest.raises(ValueError, match="unknown tools profile"):
        ToolContext(box=box, profile="fancy")


@pytest.mark.parametrize("profile", ["reference", "standard"])
async def test_submit_finishes_and_unknown_tools_are_named(
    box: DockerSandbox, profile: str
) -> None:
    ctx = ToolContext(box=box, profile=profile)
    assert await run_tool(call("submit", {}, "{}"), ctx) == ToolResult(
        "<<< Finished >>>", None, True
    )
    unknown = await run_tool(call("browse", {"url": "x"}, '{"url": "x"}'), ctx)
    assert unknown == ToolResult("Unknown action: browse")


async def test_reference_answers_non_object_arguments_like_the_package(box: DockerSandbox) -> None:
    ctx = ToolContext(box=box, profile="reference")
    bash = await run_tool(call("execute_bash", None, '"ls"'), ctx)
    assert bash == ToolResult("Exit code: 0\nExecution output of \\[execute_bash]:\n")
    editor = await run_tool(call("str_replace_editor", None, "[1, 2]"), ctx)
    assert editor == ToolResult("Execution output of \\[str_replace_editor]:\n")
    other = await run_tool(call("browse", None, "3"), ctx)
    assert other == ToolResult("Execution output of \\[browse]:\n")


async def test_reference_treats_unparsable_arguments_as_no_call(box: DockerSandbox) -> None:
    ctx = ToolContext(box=box, profile="reference")
    broken = call("execute_bash", None, '{"command": "ls"')
    assert is_no_call(broken, "reference")
    assert await run_tool(broken, ctx) == ToolResult(NO_TOOL_CALL_NUDGE)
    assert is_no_call(call("", {}, "{}"), "reference")
    assert not is_no_call(call("execute_bash", None, "[1]"), "reference")
    assert not is_no_call(broken, "standard")
    # The package's CONTINUE_MSG (observation.py), a triple-quoted string: it starts and
    # ends with a newline, has a space after "response." and a blank line before IMPORTANT.
    assert NO_TOOL_CALL_NUDGE == (
        "\nYou forgot to use a function call in your response. \n"
        "YOU MUST USE A FUNCTION CALL IN EACH RESPONSE.\n"
        "\n"
        "IMPORTANT: YOU SHOULD NEVER ASK FOR HUMAN HELP.\n"
    )


async def test_standard_explains_bad_arguments_and_accepts_empty_ones(box: DockerSandbox) -> None:
    ctx = ToolContext(box=box, profile="standard")
    broken = await run_tool(call("execute_bash", None, '{"command": "ls"'), ctx)
    assert broken == ToolResult(
        'Error: the arguments of execute_bash must be a JSON object, got: {"command": "ls"'
    )
    assert (await run_tool(call("submit", None, ""), ctx)).done
    empty = await run_tool(call("execute_bash", None, ""), ctx)
    assert empty == ToolResult("Error: No command provided.")


async def test_standard_names_the_problem_of_a_nameless_call(box: DockerSandbox) -> None:
    ctx = ToolContext(box=box, profile="standard")
    result = await run_tool(call("", {"command": "ls"}, '{"command": "ls"}'), ctx)
    assert result == ToolResult(NAMELESS_CALL)
    assert "execute_bash" in NAMELESS_CALL
