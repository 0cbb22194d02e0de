"""Tool calls as OpenAI-compatible servers really send them, made safe for the loop.

Imported by `app.llm.openai` (and its streaming code). Servers disagree on the
shape: most nest `name`/`arguments` under `function`, some put them at the top
level, some send `parameters`, an object instead of JSON text, or no id at all.
Every shape becomes a `ToolCall` (arguments None when they are not a JSON
object, so the loop answers with a clear observation), and every call is sent
back on later turns in the standard shape, with an id a tool message can answer.
"""

from __future__ import annotations

import json
from typing import Any

from app.agent.types import ToolCall


def parse_tool_calls(raw_calls: Any) -> tuple[tuple[ToolCall, ...], list[dict[str, Any]]]:
    """(the calls for the loop, the calls to keep in history); never raises."""
    calls: list[ToolCall] = []
    wire: list[dict[str, Any]] = []
    for n, raw in enumerate(raw_calls if isinstance(raw_calls, list) else ()):
        call = parse_tool_call(raw, n)
        calls.append(call)
        wire.append(raw if _well_formed(raw) else standard_shape(call))
    return tuple(calls), wire


def parse_tool_call(raw: Any, n: int = 0) -> ToolCall:
    """One call in any of the shapes above; the n-th of its turn names it when it has no id."""
    call = raw if isinstance(raw, dict) else {}
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    name = function.get("name") or call.get("name") or ""
    arguments = _first_present(
        function.get("arguments"),
        function.get("parameters"),
        call.get("arguments"),
        call.get("parameters"),
    )
    call_id = call.get("id") or f"call_sandhive_{n}"
    if isinstance(arguments, dict):  # Ollama and others send an object, not JSON text
        return ToolCall(str(call_id), str(name), arguments, json.dumps(arguments))
    raw_text = arguments if isinstance(arguments, str) else ""
    return ToolCall(str(call_id), str(name), decode_arguments(raw_text), raw_text)


def standard_shape(call: ToolCall) -> dict[str, Any]:
    """The call as OpenAI's API expects it back in an assistant message."""
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.raw_arguments},
    }


def decode_arguments(raw: str) -> dict[str, Any] | None:
    """The arguments object, or None when the text is not JSON or not an object."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _well_formed(raw: Any) -> bool:
    """Standard shape with an id: sent back verbatim, as the reference package does."""
    if not isinstance(raw, dict) or not raw.get("id"):
        return False
    function = raw.get("function")
    return isinstance(function, dict) and isinstance(function.get("name"), str)


def _first_present(*values: Any) -> Any:
    return next((value for value in values if value is not None), None)
