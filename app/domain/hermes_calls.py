"""Tool calls in a model's raw text, as Hermes-style chat templates (Qwen's, and the one
the real-model tests give SmolLM2) ask models to write them:
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Read where Sandhive gets text, not a parsed message: the token-continuous model client
(`app.llm.token_continuous`, whose completions endpoint parses nothing) and SkyRL-gym's
text environment (`app.clients.skyrl_env`). A call whose body is not a JSON object is kept
with its text as the arguments, so the loop answers it with the observation that says
why, as it does any malformed call.
"""

from __future__ import annotations

import json
import re
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def split_tool_calls(text: str) -> tuple[str, list[dict[str, str]]]:
    """(the text before the first call, every call as an OpenAI `function`: `name` and the
    `arguments` JSON text)."""
    calls = [_function(body) for body in TOOL_CALL.findall(text)]
    first = TOOL_CALL.search(text)
    content = text if first is None else text[: first.start()].rstrip()
    return content, calls


def _function(body: str) -> dict[str, str]:
    try:
        call: Any = json.loads(body)
    except ValueError:
        return {"name": "", "arguments": body}
    if not isinstance(call, dict):
        return {"name": "", "arguments": body}
    arguments = call.get("arguments", call.get("parameters", {}))
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"name": str(call.get("name", "")), "arguments": raw}
