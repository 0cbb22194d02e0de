"""The `reference` profile against what the paper's package sends, where the golden file
is silent: the no-tool-call nudge and odd outputs (non-UTF-8, binary, empty, errors).

Each expected text is written from the package (its `CONTINUE_MSG`, REFERENCE.md §1.4),
never from Sandhive's own output. Real sandboxes and the scripted model.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from app.agent.tools import ToolContext, ToolResult, run_tool
from app.agent.types import ToolCall
from app.sandbox import DockerSandbox
from app.scripted import ScriptedLLMServer, Turn
from tests.agent.test_loop import Harness

pytestmark = pytest.mark.asyncio(loop_scope="module")

PACKAGE_CONTINUE_MSG = (
    "\nYou forgot to use a function call in your response. \n"
    "YOU MUST USE A FUNCTION CALL IN EACH RESPONSE.\n"
    "\n"
    "IMPORTANT: YOU SHOULD NEVER ASK FOR HUMAN HELP.\n"
)
"""llm_in_sandbox/observation.py `CONTINUE_MSG`: note the space after "response."."""

BASH = "Exit code: 0\nExecution output of \\[execute_bash]:\n\\[STDOUT]\n"
EDITOR = "Execution output of \\[str_replace_editor]:\n"


@pytest_asyncio.fixture(loop_scope="module")
async def loop(scripted_llm: ScriptedLLMServer, box: DockerSandbox) -> AsyncIterator[Harness]:
    yield Harness(scripted_llm, box)


async def call(ctx: ToolContext, tool: str, arguments: dict[str, object]) -> ToolResult:
    return await run_tool(ToolCall("call_1", tool, arguments, json.dumps(arguments)), ctx)


async def sh(box: DockerSandbox, script: str, *args: str) -> str:
    done = await box.exec(["sh", "-c", script, "sh", *args], workdir="/")
    assert done.exit_code == 0, done.stderr
    return done.stdout.decode()


async def test_the_nudge_is_the_package_text_byte_for_byte(loop: Harness) -> None:
    turns = [Turn(content="Thinking."), Turn(tool="submit", expect="IN EACH RESPONSE")]
    _, messages = await loop.run(turns, tools_profile="reference")
    assert messages[3] == {"role": "user", "content": PACKAGE_CONTINUE_MSG + "\nSteps Remaining: 4"}


async def test_non_utf8_bytes_become_replacement_characters(box: DockerSandbox) -> None:
    """The package decodes each stream as UTF-8 with errors="replace"."""
    ctx = ToolContext(box=box, profile="reference")
    done = await call(ctx, "execute_bash", {"command": r"printf 'caf\xe9 \xff\xfe ok\n'"})
    assert done.observation == BASH + "caf\ufffd \ufffd\ufffd ok\n"


async def test_binary_output_passes_through_decoded(box: DockerSandbox) -> None:
    """NUL and other control bytes are not stripped: only ANSI codes and CR are."""
    ctx = ToolContext(box=box, profile="reference")
    done = await call(ctx, "execute_bash", {"command": r"printf 'a\000b\001c\n'"})
    assert done.observation == BASH + "a\x00b\x01c\n"


async def test_empty_output_and_stderr_only_on_failure(box: DockerSandbox) -> None:
    ctx = ToolContext(box=box, profile="reference")
    silent = await call(ctx, "execute_bash", {"command": "true"})
    assert silent.observation == BASH
    failed = await call(ctx, "execute_bash", {"command": "echo oops >&2; exit 2"})
    assert failed.observation == (
        "Exit code: Error: Exit code 2\nExecution output of \\[execute_bash]:\n"
        "\\[STDOUT]\n\n\\[STDERR]\noops\n"
    )


async def test_editor_errors_for_missing_paths_and_unknown_commands(box: DockerSandbox) -> None:
    ctx = ToolContext(box=box, profile="reference")
    missing = await call(ctx, "str_replace_editor", {"command": "view", "path": "/nope/x.py"})
    assert missing.observation == EDITOR + "Error: Path not found: /nope/x.py"
    unknown = await call(ctx, "str_replace_editor", {"command": "undo_edit", "path": "/testbed"})
    assert unknown.observation == EDITOR + "Unknown command: undo_edit"
    no_old = await call(ctx, "str_replace_editor", {"command": "str_replace", "path": "/x.py"})
    assert no_old.observation == EDITOR + "Error: old_str is required for str_replace."


async def test_an_empty_directory_listing(box: DockerSandbox) -> None:
    """`find` prints the directory itself, so the package's "(empty directory)" answer
    never shows for a directory that exists: its listing is the one line."""
    ctx = ToolContext(box=box, profile="reference")
    await sh(box, "mkdir -p /testbed/hollow")
    listed = await call(ctx, "str_replace_editor", {"command": "view", "path": "/testbed/hollow"})
    header = "Here's the files and directories up to 2 levels deep in /testbed/hollow"
    assert listed.observation == EDITOR + header + ", excluding hidden:\n/testbed/hollow\n"


async def test_a_non_utf8_python_file_is_viewed_with_replacement_characters(
    box: DockerSandbox,
) -> None:
    """The editor reads with `cat` and decodes like the shell output; a final newline
    shows as an empty numbered line (golden step 19)."""
    ctx = ToolContext(box=box, profile="reference")
    await sh(box, r"printf 'caf\351 = 1\n' > /testbed/latin1.py")
    seen = await call(ctx, "str_replace_editor", {"command": "view", "path": "/testbed/latin1.py"})
    assert seen.observation == (
        EDITOR + "Here's the result of running `cat -n` on /testbed/latin1.py:\n"
        "     1\tcaf\ufffd = 1\n     2\t"
    )
