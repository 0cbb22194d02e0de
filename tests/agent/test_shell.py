"""execute_bash with a persistent shell (`"tools": {"shell": "persistent"}`), in real sandboxes.

One bash per tool context lives in the sandbox's channel agent: state carries over,
each call still has its own stdout/stderr, exit code, live output and timeout.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import pytest_asyncio

from app.agent.bash import NO_SESSION
from app.agent.tools import ToolContext, ToolResult, run_tool, tool_schemas
from app.agent.types import OutputCallback, ToolCall
from app.sandbox import DockerSandbox
from tests.agent.conftest import MakeBox

pytestmark = pytest.mark.asyncio(loop_scope="module")

HEADER = "Exit code: {code}\nExecution output of \\[execute_bash]:\n\\[STDOUT]\n"
ENDED = "(The shell session ended; the next command starts a new shell in /testbed.)"


def shell_ctx(
    box: DockerSandbox, timeout_s: int = 120, on_output: OutputCallback | None = None
) -> ToolContext:
    return ToolContext(
        box=box,
        profile="standard",
        shell="persistent",
        command_timeout_s=timeout_s,
        on_output=on_output,
    )


async def bash(ctx: ToolContext, command: str) -> ToolResult:
    return await run_tool(ToolCall("call_1", "execute_bash", {"command": command}), ctx)


async def processes(box: DockerSandbox) -> str:
    return (await box.exec(["ps", "-eo", "args"])).stdout.decode()


@pytest_asyncio.fixture(loop_scope="module")
async def ctx(box: DockerSandbox) -> ToolContext:
    """A new session (in the module's shared sandbox) per test."""
    return shell_ctx(box)


async def test_cd_variables_and_functions_carry_over(ctx: ToolContext) -> None:
    await bash(ctx, "cd /tmp && export FOO=bar && plain=1")
    await bash(ctx, 'greet() { echo "hello $1"; }; printf() { :; }; eval() { :; }')
    result = await bash(
        ctx, 'pwd; echo "$FOO $plain"; greet you; bash -c \'echo "$FOO"\'; unset -f printf eval'
    )
    assert result == ToolResult(HEADER.format(code="0") + "/tmp\nbar 1\nhello you\nbar\n", 0)


async def test_each_call_keeps_its_own_stdout_stderr_and_exit_code(ctx: ToolContext) -> None:
    first = await bash(ctx, "echo out; echo err >&2; false")
    second = await bash(ctx, "echo again; (exit 3)")
    assert first == ToolResult(
        HEADER.format(code="Error: Exit code 1") + "out\n\n\\[STDERR]\nerr\n", 1
    )
    assert second == ToolResult(HEADER.format(code="Error: Exit code 3") + "again\n", 3)


async def test_a_syntax_error_or_a_stdin_reader_does_not_break_the_session(
    ctx: ToolContext,
) -> None:
    broken = await bash(ctx, "echo 'unterminated")
    assert broken.exit_code == 2
    assert "unexpected EOF" in broken.observation
    reader = await bash(ctx, "cat; echo read-nothing")  # stdin is empty, not the shell's input
    assert reader == ToolResult(HEADER.format(code="0") + "read-nothing\n", 0)
    assert (await bash(ctx, "echo fine")).observation == HEADER.format(code="0") + "fine\n"


async def test_output_is_streamed_live(box: DockerSandbox) -> None:
    chunks: list[tuple[str, bytes]] = []

    async def collect(stream: str, data: bytes) -> None:
        chunks.append((stream, data))

    ctx = shell_ctx(box, on_output=collect)
    await bash(ctx, "echo live; echo err >&2")
    assert b"".join(d for s, d in chunks if s == "stdout") == b"live\n"
    assert b"".join(d for s, d in chunks if s == "stderr") == b"err\n"


async def test_a_timeout_kills_the_command_and_keeps_the_session(
    ctx: ToolContext, box: DockerSandbox
) -> None:
    """The command's processes die (background ones too); the shell and its state stay."""
    await bash(ctx, "cd /tmp; export KEPT=yes")
    slow = replace(ctx, command_timeout_s=2)  # the same session, a short time limit
    started = time.monotonic()
    result = await bash(slow, "echo partial; sleep 1010 & sleep 1011; echo never")
    assert time.monotonic() - started < 30  # ended by the 2 s timeout
    assert result == ToolResult(
        HEADER.format(code="-1") + "partial\nThe command took too long to execute (>2s)", -1
    )
    left = await processes(box)
    assert "sleep 1010" not in left
    assert "sleep 1011" not in left
    after = await bash(ctx, 'pwd; echo "$KEPT"')
    assert after.observation == HEADER.format(code="0") + "/tmp\nyes\n"


async def test_a_timeout_in_the_shell_itself_restarts_the_session(box: DockerSandbox) -> None:
    ctx = shell_ctx(box, timeout_s=2)
    await bash(ctx, "cd /tmp; export GONE=1")
    result = await bash(ctx, "echo spinning; while :; do :; done")
    assert result == ToolResult(
        HEADER.format(code="-1") + "spinning\nThe command took too long to execute (>2s)\n" + ENDED,
        -1,
    )
    after = await bash(ctx, 'pwd; echo "GONE=$GONE"')
    assert after.observation == HEADER.format(code="0") + "/testbed\nGONE=\n"


async def test_exit_ends_the_session_and_the_next_call_gets_a_new_one(ctx: ToolContext) -> None:
    await bash(ctx, "cd /tmp")
    result = await bash(ctx, "echo bye; exit 4")
    assert result == ToolResult(HEADER.format(code="Error: Exit code 4") + "bye\n" + ENDED, 4)
    assert (await bash(ctx, "pwd")).observation == HEADER.format(code="0") + "/testbed\n"


async def test_a_background_job_does_not_hang_the_call(
    ctx: ToolContext, box: DockerSandbox
) -> None:
    started = time.monotonic()
    result = await bash(ctx, "sleep 1012 & echo started")
    assert time.monotonic() - started < 30  # far below the job's 1012 s
    assert result == ToolResult(HEADER.format(code="0") + "started\n", 0)
    assert "sleep 1012" in await processes(box)  # the job outlives the call
    jobs = await bash(ctx, "jobs | grep -c 'sleep 1012'")  # and the shell still knows it
    assert jobs.observation == HEADER.format(code="0") + "1\n"
    await box.exec(["pkill", "-f", "sleep 1012"])


async def test_two_tasks_keep_separate_sessions(make_box: MakeBox, box: DockerSandbox) -> None:
    one, two = shell_ctx(box), shell_ctx(box)  # even in one sandbox they do not meet
    other_box = shell_ctx(await make_box())
    await bash(one, "cd /tmp; export WHO=one")
    await bash(other_box, "cd /; export WHO=other")
    for ctx, seen in [(one, "/tmp one"), (two, "/testbed "), (other_box, "/ other")]:
        result = await bash(ctx, 'echo "$(pwd) $WHO"')
        assert result.observation == HEADER.format(code="0") + seen + "\n"


async def test_the_schema_tells_the_model_state_carries_over() -> None:
    fresh = tool_schemas("standard")[1]["function"]["description"]
    kept = tool_schemas("standard", "persistent")[1]["function"]["description"]
    assert "do not carry over" in fresh
    assert "carry over to the next call" in kept
    with pytest.raises(ValueError, match="reference"):
        tool_schemas("reference", "persistent")


async def test_without_the_channel_a_persistent_shell_is_refused_clearly(
    direct: DockerSandbox,
) -> None:
    result = await bash(shell_ctx(direct), "touch /testbed/ran")
    assert result == ToolResult(NO_SESSION, None)
    assert (await direct.exec(["ls", "/testbed"])).stdout == b"input\noutput\n"
