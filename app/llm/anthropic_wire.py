"""The Anthropic Messages wire format: the loop's OpenAI-shaped history in, a `Completion` out.

Imported by `app.llm.anthropic` only. The loop keeps its history in OpenAI form;
an assistant message made here carries the model's own content blocks under
`ANTHROPIC_CONTENT`, so thinking blocks (with their signatures) go back
exactly as they came, which the API requires while tools are in use.
Tool replies become `tool_result` blocks; same-role neighbours are merged, and
a `tool_use` the loop left unanswered (only the first call of a turn runs)
gets a "not run" result, because the Messages API refuses such a history.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from app.agent.types import Completion, Message, ToolCall, ToolSchema

ANTHROPIC_CONTENT = "anthropic_content"
"""Key of an assistant history message holding the original content blocks."""
NOT_RUN = "Error: this tool call was not run (only the first tool call of a turn is executed)."

Block = dict[str, Any]


def request_parts(
    messages: Sequence[Message], tools: Sequence[ToolSchema]
) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """(system text, messages, tools) for a Messages API request."""
    system = "\n\n".join(_text(m.get("content")) for m in messages if m.get("role") == "system")
    turns: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "system":
            continue
        wire_role = "assistant" if role == "assistant" else "user"
        blocks = _assistant_blocks(message) if role == "assistant" else _user_blocks(message)
        if turns and turns[-1]["role"] == wire_role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": wire_role, "content": blocks})
    _answer_every_tool_use(turns)
    return system, turns, [tool_definition(t) for t in tools]


def tool_definition(tool: ToolSchema) -> dict[str, Any]:
    """An OpenAI function tool as an Anthropic tool."""
    function = tool.get("function", {})
    return {
        "name": function.get("name", ""),
        "description": function.get("description", ""),
        "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
    }


def _assistant_blocks(message: Message) -> list[Block]:
    original = message.get(ANTHROPIC_CONTENT)
    if isinstance(original, list):
        return [dict(block) for block in original]
    blocks: list[Block] = []
    if text := _text(message.get("content")):
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id", ""),
                "name": function.get("name", ""),
                "input": arguments if isinstance(arguments, dict) else {},
            }
        )
    return blocks


def _user_blocks(message: Message) -> list[Block]:
    text = _text(message.get("content"))
    if message.get("role") == "tool":
        result: Block = {"type": "tool_result", "tool_use_id": message.get("tool_call_id", "")}
        if text:
            result["content"] = text
        return [result]
    return [{"type": "text", "text": text or "(empty)"}]


def _answer_every_tool_use(turns: list[dict[str, Any]]) -> None:
    """Give each unanswered tool_use a "not run" result at the front of the next user turn."""
    for position, turn in enumerate(turns):
        if turn["role"] != "assistant":
            continue
        ids = [b["id"] for b in turn["content"] if b.get("type") == "tool_use"]
        if not ids:
            continue
        if position + 1 == len(turns):
            turns.append({"role": "user", "content": []})
        following = turns[position + 1]["content"]
        answered = {b.get("tool_use_id") for b in following if b.get("type") == "tool_result"}
        missing = [
            {"type": "tool_result", "tool_use_id": i, "content": NOT_RUN, "is_error": True}
            for i in ids
            if i not in answered
        ]
        # The API wants tool_result blocks before any text in a user turn.
        results = [b for b in following if b.get("type") == "tool_result"]
        others = [b for b in following if b.get("type") != "tool_result"]
        turns[position + 1]["content"] = [*results, *missing, *others]


def parse_message(data: Any) -> Completion:
    """A Messages API `message` object as a `Completion`; raises on a malformed one."""
    blocks = data["content"]
    if not isinstance(blocks, list):
        raise TypeError("content is not a list")
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    thinking = "".join(b.get("thinking", "") for b in blocks if b.get("type") == "thinking")
    calls = tuple(
        ToolCall(
            id=str(b.get("id", "")),
            name=str(b.get("name", "")),
            arguments=b.get("input") if isinstance(b.get("input"), dict) else None,
            raw_arguments=json.dumps(b.get("input")),
        )
        for b in blocks
        if b.get("type") == "tool_use"
    )
    usage = data.get("usage") or {}
    prompt_tokens = sum(
        int(usage.get(key) or 0)
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    message: Message = {"role": "assistant", "content": text or None, ANTHROPIC_CONTENT: blocks}
    if calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.raw_arguments},
            }
            for c in calls
        ]
    return Completion(
        message=message,
        content=text,
        reasoning=thinking,
        tool_calls=calls,
        prompt_tokens=prompt_tokens,
        completion_tokens=int(usage.get("output_tokens") or 0),
    )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
