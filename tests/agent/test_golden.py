"""The reference profile against observations recorded from the paper's own package.

Replays every call of shared/golden/reference-observations.jsonl, in order, in one
fresh sandbox (as the package did) and compares what the model would receive,
"Steps Remaining" suffix included, byte for byte.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import pytest

from app.agent.tools import ToolContext, run_tool
from app.agent.types import ToolCall
from tests.agent.conftest import MakeBox

pytestmark = pytest.mark.asyncio(loop_scope="module")

GOLDEN = Path(__file__).parent / "golden" / "reference-observations.jsonl"
"""A copy of shared/golden/reference-observations.jsonl (recorded from llm-in-sandbox 0.2.0)."""


def load_golden() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = [json.loads(line) for line in GOLDEN.read_text().splitlines() if line.strip()]
    prompt = next(line for line in lines if line["kind"] == "prompt")
    steps = sorted((line for line in lines if line["kind"] == "step"), key=lambda s: s["index"])
    return prompt, steps


def describe(index: int, want: str, got: str) -> str:
    diff = difflib.unified_diff(want.splitlines(True), got.splitlines(True), "golden", "ours")
    return f"step {index} differs:\n" + "".join(list(diff)[:60])


async def test_reference_profile_replays_the_golden_file(make_box: MakeBox) -> None:
    prompt, steps = load_golden()
    assert len(steps) >= 20
    ctx = ToolContext(box=await make_box(), profile="reference")
    mismatches: list[str] = []
    for step in steps:
        call = ToolCall(
            id=f"call_{step['index']}",
            name=step["tool"],
            arguments=step["arguments"],
            raw_arguments=json.dumps(step["arguments"]),
        )
        result = await run_tool(call, ctx)
        want = step["observation_sent_to_model"]
        if want is None:  # the final submit: nothing is sent back
            assert step["tool"] == "submit"
            assert result.done
            assert result.observation == "<<< Finished >>>"
            continue
        assert not result.done
        # The loop appends the count for the *next* call: max_steps - (index + 1).
        got = f"{result.observation}\nSteps Remaining: {prompt['max_steps'] - step['index'] - 1}"
        if got != want:
            mismatches.append(describe(step["index"], want, got))
    assert not mismatches, "\n".join(mismatches)


async def test_golden_exit_codes_are_reported(make_box: MakeBox) -> None:
    ctx = ToolContext(box=await make_box(), profile="reference")
    ok = await run_tool(ToolCall("a", "execute_bash", {"command": "true"}), ctx)
    failed = await run_tool(ToolCall("b", "execute_bash", {"command": "exit 3"}), ctx)
    edited = await run_tool(ToolCall("c", "str_replace_editor", {"command": "view"}), ctx)
    assert (ok.exit_code, failed.exit_code, edited.exit_code) == (0, 3, None)
    assert failed.observation.startswith("Exit code: Error: Exit code 3\n")
