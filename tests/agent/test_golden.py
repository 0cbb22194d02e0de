"""Both tool profiles against observations recorded from the paper's own package.

Replays every call of shared/golden/reference-observations.jsonl, in order, in one
fresh sandbox (as the package did) and compares what the model would receive,
"Steps Remaining" suffix included, byte for byte.

`reference` must match every line. `standard` must match every line too, except
the steps in `STANDARD_DIFFERENCES`: each is the golden text changed by one of
the fixes docs/agent.md ("Tool profiles") documents, written out below from the golden
line and the fix — never from Sandhive's own output.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.agent.tools import ToolContext, run_tool
from app.agent.types import ToolCall
from tests.agent.conftest import MakeBox

pytestmark = pytest.mark.asyncio(loop_scope="module")

GOLDEN = Path(__file__).parent / "golden" / "reference-observations.jsonl"
"""A copy of shared/golden/reference-observations.jsonl (recorded from llm-in-sandbox 0.2.0)."""

PREFIX = "Execution output of \\[str_replace_editor]:\n"


def load_golden() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = [json.loads(line) for line in GOLDEN.read_text().splitlines() if line.strip()]
    prompt = next(line for line in lines if line["kind"] == "prompt")
    steps = sorted((line for line in lines if line["kind"] == "step"), key=lambda s: s["index"])
    return prompt, steps


def replaced(text: str, old: str, new: str) -> str:
    """`text` with its single `old` replaced; fails loudly if the golden text moved."""
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in the golden text"
    return text.replace(old, new)


def args_of(steps: list[dict[str, Any]], index: int) -> dict[str, Any]:
    return next(s["arguments"] for s in steps if s["index"] == index)


def standard_mod_py(steps: list[dict[str, Any]]) -> str:
    """/testbed/pkg/sub/mod.py under `standard`: the golden edits applied to the exact bytes.

    Step 7 creates it with `file_text` (no newline added), step 12 inserts a line at
    the top, steps 13 and 14 replace text; step 17's overwrite is refused.
    """
    text = str(args_of(steps, 7)["file_text"])
    text = args_of(steps, 12)["new_str"] + "\n" + text
    for index in (13, 14):
        args = args_of(steps, index)
        text = replaced(text, args["old_str"], args.get("new_str", ""))
    return text


def no_growth_view_range_error(golden: str, steps: list[dict[str, Any]]) -> str:
    """`view_range` errors name the file's line count: 9 without the package's two extra
    newlines (echo on create adds one, `cat -n`-style splitting counts one more)."""
    lines = str(args_of(steps, 7)["file_text"]).count("\n")
    assert lines == 9
    return replaced(golden, "<= 11,", f"<= {lines},")


Expected = Callable[[str, list[dict[str, Any]]], str]

STANDARD_DIFFERENCES: dict[int, tuple[str, Expected]] = {
    # create: the file holds file_text exactly and its final newline ends line 9; the
    # package's echo added a newline and its listing showed an empty line 10.
    7: (
        "no trailing-newline growth, no extra empty numbered line",
        lambda g, _s: replaced(g, "     9\tprint(g(1, 2))\n    10\t\n", "     9\tprint(g(1, 2))\n"),
    ),
    # view [2, -1]: the package's file had two extra empty lines 10 and 11.
    9: (
        "no trailing-newline growth, no extra empty numbered line",
        lambda g, _s: replaced(
            g, "     9\tprint(g(1, 2))\n    10\t\n    11\t", "     9\tprint(g(1, 2))"
        ),
    ),
    10: ("no trailing-newline growth: the file has 9 lines", no_growth_view_range_error),
    11: ("no trailing-newline growth: the file has 9 lines", no_growth_view_range_error),
    # str_replace snippet: lines 2..9 of the edited 9-line file; the package's line 10
    # was the empty one its growing trailing newlines made.
    13: (
        "no extra empty numbered line after the file's final newline",
        lambda g, _s: replaced(g, "     9\tprint(g(1, 2))\n    10\t\n", "     9\tprint(g(1, 2))\n"),
    ),
    # create on an existing file: refused, the file keeps its content.
    17: (
        "create refuses to overwrite",
        lambda _g, _s: (
            PREFIX
            + "Error: File already exists at: /testbed/pkg/sub/mod.py. Cannot overwrite files "
            "using command `create`; use `str_replace` or `insert` to change it."
            + "\nSteps Remaining: 82"
        ),
    ),
    # view of the file created with file_text "": it is 0 bytes (no newline added), so
    # the package's own empty-file answer applies instead of two numbered empty lines.
    19: (
        "no trailing-newline growth: an empty file_text makes a 0-byte file",
        lambda _g, _s: PREFIX + "(empty file: /testbed/empty.py)\nSteps Remaining: 80",
    ),
    # cat of mod.py: the edited file (step 17 was refused), without the echo's extra newline.
    23: (
        "create refuses to overwrite; no trailing-newline growth",
        lambda g, s: replaced(g, "overwritten = True\n\n", standard_mod_py(s)),
    ),
}


def describe(index: int, want: str, got: str) -> str:
    diff = difflib.unified_diff(want.splitlines(True), got.splitlines(True), "expected", "ours")
    return f"step {index} differs:\n" + "".join(list(diff)[:60])


def expected_observation(profile: str, step: dict[str, Any], steps: list[dict[str, Any]]) -> str:
    golden = str(step["observation_sent_to_model"])
    if profile == "standard" and step["index"] in STANDARD_DIFFERENCES:
        _, expect = STANDARD_DIFFERENCES[step["index"]]
        derived = expect(golden, steps)
        assert derived != golden, f"step {step['index']}: the listed fix changes nothing"
        return derived
    return golden


async def test_standard_mod_py_is_derived_from_the_golden_calls() -> None:
    _, steps = load_golden()
    assert standard_mod_py(steps) == (
        "#!/usr/bin/env python3\n\n\ndef g(a, b):  \n    return a + b\n\n\nprint(g(1, 2))\n"
    )


@pytest.mark.parametrize("profile", ["reference", "standard"])
async def test_profile_replays_the_golden_file(make_box: MakeBox, profile: str) -> None:
    prompt, steps = load_golden()
    assert len(steps) >= 20
    assert set(STANDARD_DIFFERENCES) <= {s["index"] for s in steps}
    ctx = ToolContext(box=await make_box(), profile=profile)
    mismatches: list[str] = []
    for step in steps:
        call = ToolCall(
            id=f"call_{step['index']}",
            name=step["tool"],
            arguments=step["arguments"],
            raw_arguments=json.dumps(step["arguments"]),
        )
        result = await run_tool(call, ctx)
        if step["observation_sent_to_model"] is None:  # the final submit: nothing is sent back
            assert step["tool"] == "submit"
            assert result.done
            assert result.observation == "<<< Finished >>>"
            continue
        assert not result.done
        # The loop appends the count for the *next* call: max_steps - (index + 1).
        got = f"{result.observation}\nSteps Remaining: {prompt['max_steps'] - step['index'] - 1}"
        want = expected_observation(profile, step, steps)
        if got != want:
            mismatches.append(describe(step["index"], want, got))
    assert not mismatches, "\n".join(mismatches)
    if profile == "standard":  # the refused create left the edited file in place
        edited = await ctx.box.exec(["cat", "/testbed/pkg/sub/mod.py"], workdir="/testbed")
        assert edited.stdout.decode() == standard_mod_py(steps)


async def test_golden_exit_codes_are_reported(make_box: MakeBox) -> None:
    ctx = ToolContext(box=await make_box(), profile="reference")
    ok = await run_tool(ToolCall("a", "execute_bash", {"command": "true"}), ctx)
    failed = await run_tool(ToolCall("b", "execute_bash", {"command": "exit 3"}), ctx)
    edited = await run_tool(ToolCall("c", "str_replace_editor", {"command": "view"}), ctx)
    assert (ok.exit_code, failed.exit_code, edited.exit_code) == (0, 3, None)
    assert failed.observation.startswith("Exit code: Error: Exit code 3\n")
