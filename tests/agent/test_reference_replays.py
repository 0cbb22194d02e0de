"""More of the package's behaviour replayed in the `reference` profile: each tool's errors,
empty, long, binary and non-UTF-8 output, and a command that times out.

First the package's own answers, recorded from llm-in-sandbox 0.2.0 by
golden/record_replays.py into golden/reference-replays.jsonl, replayed byte for byte. Then
the same cases one by one, each expected text written from the package's code (`agent.py`,
`docker_runtime.py`, `observation.py`; REFERENCE.md §1.4) with the line that makes it,
never from Sandhive's own output. Real sandboxes.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import pytest

from app.agent.tools import ToolContext, run_tool
from app.agent.types import ToolCall
from app.sandbox import DockerSandbox
from tests.agent.conftest import MakeBox

pytestmark = pytest.mark.asyncio(loop_scope="module")

HEAD = "Execution output of \\[execute_bash]:\n"
EDITOR = "Execution output of \\[str_replace_editor]:\n"
DIVIDER = "-" * 50
CUT = f"{DIVIDER}\n<Observation truncated in middle for saving context>\n{DIVIDER}"


def bash(code: str, stdout: str, stderr: str = "") -> str:
    """The package's Observation for execute_bash: STDERR only when it is not blank."""
    text = f"Exit code: {code}\n{HEAD}\\[STDOUT]\n{stdout}"
    return text + (f"\n\\[STDERR]\n{stderr}" if stderr.strip() else "")


def lines(prefix: str, first: int, last: int) -> str:
    return "\n".join(f"{prefix}{i}" for i in range(first, last + 1))


async def call(ctx: ToolContext, tool: str, arguments: object) -> str:
    raw = json.dumps(arguments)
    parsed = arguments if isinstance(arguments, dict) else None
    return (await run_tool(ToolCall("call_1", tool, parsed, raw), ctx)).observation


@pytest.fixture
def ctx(box: DockerSandbox) -> ToolContext:
    return ToolContext(box=box, profile="reference")


# ---------------------------------------------------------------- the package's recording

RECORDED = Path(__file__).parent / "golden" / "reference-replays.jsonl"
SHORT_TIMEOUT_S = 2
"""The recording's timeout case waited the package's 120 s; the replay uses 2 s and expects
the same text with the number changed (the package prints its own limit)."""
SPACED = "/testbed/my dir"
KNOWN_DIFFERENCES = {
    f"view {SPACED}": (
        EDITOR + "Here's the files and directories up to 2 levels deep in "
        f"{SPACED}, excluding hidden:\n{SPACED}\n"
    ),
}
"""Sandhive's answer where it knowingly differs (docs/agent.md, "Tool profiles"): the
package splices the path unquoted into `test -d`, so a path with a space is "not found";
Sandhive passes it as one argument and lists the directory."""


def recording() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = [json.loads(line) for line in RECORDED.read_text().splitlines() if line.strip()]
    [source] = [line for line in lines if line["kind"] == "source"]
    return source, [line for line in lines if line["kind"] == "step"]


def case_name(step: dict[str, Any]) -> str:
    arguments = step["arguments"]
    if isinstance(arguments, dict) and "path" in arguments:
        return f"{arguments.get('command')} {arguments['path']}"
    return json.dumps(arguments)


async def test_the_packages_recorded_answers_replay_byte_for_byte(make_box: MakeBox) -> None:
    source, steps = recording()
    assert source["package"] == "llm-in-sandbox 0.2.0"
    assert len(steps) >= 25
    box = await make_box()
    setup = await box.exec(["bash", "-c", source["setup"]], workdir="/testbed")
    assert setup.exit_code == 0, setup.stderr
    ctx = ToolContext(box=box, profile="reference")
    short = ToolContext(box=box, profile="reference", command_timeout_s=SHORT_TIMEOUT_S)
    mismatches = []
    for step in steps:
        want = str(step["observation"])
        use = ctx
        if "sleep 130" in json.dumps(step["arguments"]):
            use, want = short, want.replace("(>120s)", f"(>{SHORT_TIMEOUT_S}s)")
        want = KNOWN_DIFFERENCES.get(case_name(step), want)
        got = await call(use, step["tool"], step["arguments"])
        if got != want:
            diff = difflib.unified_diff(
                want.splitlines(True), got.splitlines(True), "package", "ours"
            )
            mismatches.append(
                f"step {step['index']} {case_name(step)}:\n" + "".join(list(diff)[:30])
            )
    assert not mismatches, "\n".join(mismatches)
    assert {case_name(s) for s in steps} >= set(KNOWN_DIFFERENCES), "a difference lost its case"


# ---------------------------------------------------------------- one by one, from the code


# ---------------------------------------------------------------- execute_bash


async def test_an_empty_or_missing_command_gets_the_bare_error(ctx: ToolContext) -> None:
    """`if not command: return "Error: No command provided."`: no Observation around it."""
    assert await call(ctx, "execute_bash", {"command": ""}) == "Error: No command provided."
    assert await call(ctx, "execute_bash", {}) == "Error: No command provided."


async def test_a_timed_out_command_gets_the_message_and_loses_its_output(
    box: DockerSandbox,
) -> None:
    """`if exit_code == 124: return "The command took too long ...", "", "-1"`: what it printed
    before is gone, the exit code line says -1 (the package's T is CMD_TIMEOUT, 120)."""
    ctx = ToolContext(box=box, profile="reference", command_timeout_s=2)
    seen = await call(ctx, "execute_bash", {"command": "echo partial; echo err >&2; sleep 30"})
    assert seen == bash("-1", "The command took too long to execute (>2s)")


async def test_a_command_that_exits_124_is_taken_for_a_timeout(ctx: ToolContext) -> None:
    """The package tests the exit code, not the clock: `timeout`'s 124 and a command's own
    124 look the same to it."""
    seen = await call(ctx, "execute_bash", {"command": "echo done; exit 124"})
    assert seen == bash("-1", "The command took too long to execute (>120s)")


async def test_long_stderr_is_cut_like_stdout_each_stream_on_its_own(ctx: ToolContext) -> None:
    command = (
        "for i in $(seq 1 81); do echo o$i; done; for i in $(seq 1 100); do echo e$i >&2; done"
    )
    seen = await call(ctx, "execute_bash", {"command": command})
    out = f"{lines('o', 1, 40)}\n{CUT}\n{lines('o', 42, 81)}"
    err = f"{lines('e', 1, 40)}\n{CUT}\n{lines('e', 61, 100)}"
    assert seen == bash("0", out, err)


async def test_eighty_lines_pass_whole(ctx: ToolContext) -> None:
    """The cut is for more than 80 lines; 80 with their final newline pass as they are."""
    seen = await call(ctx, "execute_bash", {"command": "seq 1 80"})
    assert seen == bash("0", lines("", 1, 80) + "\n")


async def test_one_enormous_line_is_not_cut(ctx: ToolContext) -> None:
    """Line-based only: no byte cap in the package."""
    seen = await call(ctx, "execute_bash", {"command": "head -c 200000 /dev/zero | tr '\\0' x"})
    assert seen == bash("0", "x" * 200_000)


async def test_colour_codes_and_carriage_returns_are_stripped(ctx: ToolContext) -> None:
    """`re.sub(r"\\x1b\\[[0-9;]*m|\\r", "", ...)` on each stream; other escapes stay."""
    command = (
        r"printf '\033[1;31mred\033[0m\r\n50%%\r100%%\n\033[2Kline\n'; printf '\033[33mw\r\n' >&2"
    )
    seen = await call(ctx, "execute_bash", {"command": command})
    assert seen == bash("0", "red\n50%100%\n\x1b[2Kline\n", "w\n")


async def test_whitespace_only_stderr_is_left_out(ctx: ToolContext) -> None:
    seen = await call(ctx, "execute_bash", {"command": "echo out; printf '  \\n\\n' >&2; exit 3"})
    assert seen == bash("Error: Exit code 3", "out\n")


async def test_invalid_utf8_on_both_streams(ctx: ToolContext) -> None:
    """`decode("utf-8", errors="replace")` per stream: a cut sequence is one U+FFFD."""
    command = r"printf '\xe2\x9c ok \xc3\n'; printf '\xff\n' >&2"
    seen = await call(ctx, "execute_bash", {"command": command})
    assert seen == bash("0", "\ufffd ok \ufffd\n", "\ufffd\n")


async def test_an_unknown_tool_is_named(ctx: ToolContext) -> None:
    assert await call(ctx, "python", {"code": "1"}) == "Unknown action: python"


# ---------------------------------------------------------------- str_replace_editor


async def test_view_range_start_out_of_the_file(ctx: ToolContext, box: DockerSandbox) -> None:
    """`not (1 <= start <= total_lines)`: the range printed as the Python list it was."""
    await box.exec(["sh", "-c", "printf 'a\\nb\\n' > /testbed/two.py"], workdir="/")
    seen = await call(
        ctx,
        "str_replace_editor",
        {"command": "view", "path": "/testbed/two.py", "view_range": [0, 2]},
    )
    assert seen == EDITOR + "Error: Invalid view_range [0, 2]: start line must be in [1, 3]"
    past = await call(
        ctx,
        "str_replace_editor",
        {"command": "view", "path": "/testbed/two.py", "view_range": [4, -1]},
    )
    assert past == EDITOR + "Error: Invalid view_range [4, -1]: start line must be in [1, 3]"


async def test_viewing_a_file_that_is_not_python(ctx: ToolContext, box: DockerSandbox) -> None:
    await box.exec(["sh", "-c", "echo hi > /testbed/notes.txt"], workdir="/")
    seen = await call(ctx, "str_replace_editor", {"command": "view", "path": "/testbed/notes.txt"})
    assert seen == EDITOR + (
        "ERROR: Viewing non-Python files is disallowed for saving context. "
        "File '/testbed/notes.txt' is not a .py or .rst file."
    )


async def test_str_replace_finds_nothing_or_too_much(ctx: ToolContext, box: DockerSandbox) -> None:
    await box.exec(["sh", "-c", "printf 'x = 1\\nx = 1\\n' > /testbed/dup.py"], workdir="/")
    path = "/testbed/dup.py"
    none = await call(
        ctx, "str_replace_editor", {"command": "str_replace", "path": path, "old_str": "y"}
    )
    assert none == EDITOR + f"Error: No occurrences of old_str found in {path} for replacement."
    two = await call(
        ctx, "str_replace_editor", {"command": "str_replace", "path": path, "old_str": "x = 1"}
    )
    assert two == EDITOR + (
        f"Error: Multiple occurrences (2) of old_str found in {path}. "
        "Please ensure it is unique before using str_replace."
    )


async def test_str_replace_in_an_empty_file(ctx: ToolContext, box: DockerSandbox) -> None:
    await box.exec(["sh", "-c", ": > /testbed/void.py"], workdir="/")
    seen = await call(
        ctx,
        "str_replace_editor",
        {"command": "str_replace", "path": "/testbed/void.py", "old_str": "a"},
    )
    assert seen == EDITOR + "Error: Could not read file /testbed/void.py"


async def test_str_replace_in_a_missing_file_searches_cats_error(ctx: ToolContext) -> None:
    """`runtime.run(f"cat {path}")` merges stderr into the "content": a missing file reads as
    cat's message, so the answer is "no occurrences", not "could not read"."""
    path = "/testbed/absent.py"
    seen = await call(
        ctx, "str_replace_editor", {"command": "str_replace", "path": path, "old_str": "a = 1"}
    )
    assert seen == EDITOR + f"Error: No occurrences of old_str found in {path} for replacement."


async def test_insert_line_out_of_range(ctx: ToolContext, box: DockerSandbox) -> None:
    """`lines = file_content.split('\\n')`: a final newline counts one more line."""
    await box.exec(["sh", "-c", "printf 'a\\nb\\n' > /testbed/ins.py"], workdir="/")
    seen = await call(
        ctx,
        "str_replace_editor",
        {"command": "insert", "path": "/testbed/ins.py", "insert_line": 5, "new_str": "c"},
    )
    assert seen == EDITOR + "Error: Invalid insert_line 5. Must be in [0, 3]."
    below = await call(
        ctx,
        "str_replace_editor",
        {"command": "insert", "path": "/testbed/ins.py", "insert_line": -1, "new_str": "c"},
    )
    assert below == EDITOR + "Error: Invalid insert_line -1. Must be in [0, 3]."


async def test_insert_into_a_missing_file_writes_cats_error_into_it(
    ctx: ToolContext, box: DockerSandbox
) -> None:
    """The same merged `cat`: inserting into a file that does not exist creates it, holding
    the new line, cat's complaint and the echo's newline."""
    path = "/testbed/ghost.py"
    complaint = f"cat: {path}: No such file or directory"
    seen = await call(
        ctx,
        "str_replace_editor",
        {"command": "insert", "path": path, "insert_line": 0, "new_str": "x"},
    )
    assert seen == EDITOR + (
        f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet "
        f"of the edited file:\n     1\tx\n     2\t{complaint}\n     3\t\n"
        "Review the changes and make sure they are as expected (correct indentation, "
        "no duplicate lines, etc). Edit the file again if necessary."
    )
    written = await box.exec(["cat", path], workdir="/")
    assert written.stdout.decode() == f"x\n{complaint}\n\n"


async def test_create_over_a_directory_fails_with_the_shells_words(ctx: ToolContext) -> None:
    """`echo '...' > /testbed/input` fails in bash; its merged output follows the prefix."""
    seen = await call(
        ctx,
        "str_replace_editor",
        {"command": "create", "path": "/testbed/input", "file_text": "x"},
    )
    assert seen == EDITOR + "Error creating file: bash: line 1: /testbed/input: Is a directory\n"


async def test_a_directory_listing_stops_at_100_lines(ctx: ToolContext, box: DockerSandbox) -> None:
    """`find ... | head -100`: the directory itself and 99 entries; other files are hidden."""
    script = "mkdir -p /testbed/many && cd /testbed/many && touch $(seq -f 'f%03g.py' 1 150) a.txt"
    await box.exec(["sh", "-c", script], workdir="/")
    seen = await call(ctx, "str_replace_editor", {"command": "view", "path": "/testbed/many"})
    header = EDITOR + "Here's the files and directories up to 2 levels deep in /testbed/many"
    assert seen.startswith(header + ", excluding hidden:\n/testbed/many\n")
    listed = seen.split("excluding hidden:\n", 1)[1].splitlines()
    assert len(listed) == 100
    assert "/testbed/many/a.txt" not in listed
    assert seen.endswith("\n")


async def test_an_editor_call_with_a_non_object_is_its_header_only(ctx: ToolContext) -> None:
    """Arguments that decode to a list: the package's formatter takes the function-name
    branch and sends the header with no body (REFERENCE.md §1.4, "Other cases")."""
    assert await call(ctx, "str_replace_editor", ["view", "/testbed"]) == EDITOR
    assert await call(ctx, "execute_bash", ["ls"]) == f"Exit code: 0\n{HEAD}"
