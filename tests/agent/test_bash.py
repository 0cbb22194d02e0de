"""execute_bash in both profiles, in a real sandbox: layout, truncation, timeouts, kills."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.agent.tools import ToolContext, ToolResult, run_tool
from app.agent.types import AgentSpec, ToolCall
from app.config import Settings
from app.runner.local import resolve_run
from app.sandbox import DockerSandbox

pytestmark = pytest.mark.asyncio(loop_scope="module")

HEADER = "Execution output of \\[execute_bash]:\n"
DIVIDER = "-" * 50
MARKER = "<Observation truncated in middle for saving context>"


async def bash(
    box: DockerSandbox, command: object, profile: str, timeout_s: int = 120
) -> ToolResult:
    ctx = ToolContext(box=box, profile=profile, command_timeout_s=timeout_s)
    return await run_tool(ToolCall("call_1", "execute_bash", {"command": command}), ctx)


async def processes(box: DockerSandbox) -> str:
    return (await box.exec(["ps", "-eo", "args"])).stdout.decode()


# ---------------------------------------------------------------- reference


async def test_reference_timeout_replaces_output_with_the_package_message(
    box: DockerSandbox,
) -> None:
    started = time.monotonic()
    result = await bash(box, "echo partial; sleep 100", "reference", timeout_s=2)
    assert time.monotonic() - started < 30  # ended by the 2 s timeout, not by the 100 s sleep
    assert result.observation == (
        "Exit code: -1\n" + HEADER + "\\[STDOUT]\nThe command took too long to execute (>2s)"
    )
    assert result.exit_code == -1


async def test_the_default_command_timeout_is_the_package_120_s(box: DockerSandbox) -> None:
    # The package's CMD_TIMEOUT = 120 everywhere a task's timeout comes from.
    assert Settings.model_fields["default_command_timeout_s"].default == 120
    assert AgentSpec(system_prompt="s", user_prompt="u").command_timeout_s == 120
    local = Settings(_env_file=None, llm_base_url="http://127.0.0.1:9/v1", llm_model="m")
    assert resolve_run(local, {"prompt": "p"}).limits.command_timeout_s == 120  # sandhive run
    ctx = ToolContext(box=box, profile="reference")
    assert ctx.command_timeout_s == 120
    # The package reads exit status 124 (GNU timeout's) as its timeout, whatever ended the
    # command, so `exit 124` shows the message a 120 s timeout gives without waiting for it.
    result = await run_tool(ToolCall("call_1", "execute_bash", {"command": "exit 124"}), ctx)
    assert result.observation == (
        "Exit code: -1\n" + HEADER + "\\[STDOUT]\nThe command took too long to execute (>120s)"
    )
    assert result.exit_code == -1


async def test_reference_blank_stdout_shows_an_empty_stdout_section(box: DockerSandbox) -> None:
    # REFERENCE.md §1.4 with the package's Observation rule: a stdout that is blank after
    # strip() is left out of the STDOUT section (golden steps 2 and 3 show the same empty
    # section for no stdout at all); no STDERR section when stderr is blank too.
    result = await bash(box, "echo '   '; echo '  ' >&2", "reference")
    assert result.observation == "Exit code: 0\n" + HEADER + "\\[STDOUT]\n"
    assert result.exit_code == 0


async def test_reference_timeout_still_ends_a_command_that_ignores_sigterm(
    box: DockerSandbox,
) -> None:
    started = time.monotonic()
    result = await bash(box, "trap '' TERM; sleep 1003", "reference", timeout_s=2)
    # RELIABILITY S-08 asks for command_timeout_s + 2; the slack is for a loaded CI host.
    assert time.monotonic() - started < 15
    assert result.exit_code == -1
    assert "The command took too long to execute (>2s)" in result.observation
    assert "sleep 1003" not in await processes(box)


@pytest.mark.parametrize("profile", ["reference", "standard"])
async def test_more_than_80_lines_keep_the_first_and_last_40(
    box: DockerSandbox, profile: str
) -> None:
    result = await bash(box, "seq 1 81; seq 101 180 >&2", profile)
    top = "\n".join(str(i) for i in range(1, 41))
    bottom = "\n".join(str(i) for i in range(42, 82))
    stdout = f"{top}\n{DIVIDER}\n{MARKER}\n{DIVIDER}\n{bottom}"
    stderr = "\n".join(str(i) for i in range(101, 181)) + "\n"  # exactly 80 lines: untouched
    assert result.observation == (
        "Exit code: 0\n" + HEADER + f"\\[STDOUT]\n{stdout}\n\\[STDERR]\n{stderr}"
    )


async def test_reference_strips_colour_codes_and_carriage_returns(box: DockerSandbox) -> None:
    result = await bash(box, r"printf '\033[31mred\033[0m\r\nok\r\n'", "reference")
    assert result.observation == "Exit code: 0\n" + HEADER + "\\[STDOUT]\nred\nok\n"


@pytest.mark.parametrize("profile", ["reference", "standard"])
@pytest.mark.parametrize("command", ["", None])
async def test_no_command_is_a_bare_error(
    box: DockerSandbox, profile: str, command: object
) -> None:
    result = await bash(box, command, profile)
    assert result == ToolResult("Error: No command provided.", None)


# ---------------------------------------------------------------- standard


async def test_standard_keeps_partial_output_on_timeout(box: DockerSandbox) -> None:
    started = time.monotonic()
    result = await bash(box, "echo partial; echo oops >&2; sleep 100", "standard", timeout_s=2)
    assert time.monotonic() - started < 30  # ended by the 2 s timeout, not by the 100 s sleep
    assert result.exit_code == -1
    assert result.observation == (
        "Exit code: -1\n"
        + HEADER
        + "\\[STDOUT]\npartial\nThe command took too long to execute (>2s)\n\\[STDERR]\noops\n"
    )


async def test_standard_timeout_kills_every_process_the_command_started(
    box: DockerSandbox,
) -> None:
    command = "sleep 1000 & (trap '' TERM; sleep 1001) & setsid sleep 1002 & sleep 1004"
    result = await bash(box, command, "standard", timeout_s=2)
    assert result.exit_code == -1
    left = await processes(box)
    assert not [n for n in ("1000", "1001", "1002", "1004") if f"sleep {n}" in left], left


async def test_standard_returns_when_the_command_ends_despite_a_background_job(
    box: DockerSandbox,
) -> None:
    started = time.monotonic()
    result = await bash(box, "sleep 1005 & echo started", "standard", timeout_s=60)
    assert time.monotonic() - started < 30  # far below the job's 1005 s: it was not awaited
    assert result.observation == "Exit code: 0\n" + HEADER + "\\[STDOUT]\nstarted\n"
    assert "sleep 1005" in await processes(box)  # like nohup: the job outlives the call
    await box.exec(["pkill", "-f", "sleep 1005"])


async def test_standard_caps_bytes_per_stream(box: DockerSandbox) -> None:
    result = await bash(box, "python3 -c \"print('x' * 300000)\"", "standard")
    body = result.observation.removeprefix("Exit code: 0\n" + HEADER + "\\[STDOUT]\n")
    head, divider, marker, divider2, tail = body.split("\n", 4)
    assert head == "x" * 32768  # first half of the 64 KiB cap
    assert tail == "x" * 32767 + "\n"  # last half, the final newline included
    assert divider == divider2 == DIVIDER
    assert marker == "<Observation truncated in middle: 234465 bytes omitted (limit 65536 bytes)>"


async def test_reference_has_no_byte_cap(box: DockerSandbox) -> None:
    result = await bash(box, "python3 -c \"print('x' * 300000)\"", "reference")
    assert result.observation == "Exit code: 0\n" + HEADER + "\\[STDOUT]\n" + "x" * 300000 + "\n"


async def test_standard_reports_exit_codes_like_the_reference(box: DockerSandbox) -> None:
    result = await bash(box, "echo out; exit 3", "standard")
    assert result.observation == "Exit code: Error: Exit code 3\n" + HEADER + "\\[STDOUT]\nout\n"
    assert result.exit_code == 3


async def test_standard_is_a_fresh_shell_in_the_workdir_each_call(box: DockerSandbox) -> None:
    await bash(box, "cd /tmp && export FOO=bar", "standard")
    result = await bash(box, 'pwd; echo "FOO=$FOO"; echo "$0"', "standard")
    assert result.observation.endswith("\\[STDOUT]\n/testbed\nFOO=\nbash\n")


async def test_output_is_streamed_while_the_command_runs(box: DockerSandbox) -> None:
    chunks: list[tuple[str, bytes]] = []

    async def collect(stream: str, data: bytes) -> None:
        chunks.append((stream, data))

    ctx = ToolContext(box=box, profile="standard", on_output=collect)
    await run_tool(ToolCall("c", "execute_bash", {"command": "echo live; echo err >&2"}), ctx)
    assert b"".join(d for s, d in chunks if s == "stdout") == b"live\n"
    assert b"".join(d for s, d in chunks if s == "stderr") == b"err\n"


# ---------------------------------------------------------------- standard, channel or not


SAME_EVERYWHERE = [
    "echo out; echo err >&2; exit 3",
    "seq 1 100",
    "printf 'no newline'",
    'echo "$0 $SHLVL"; pwd; cat',
    "sleep 1013 & echo started; echo bye >&2",
]


async def test_standard_observations_do_not_depend_on_the_channel(
    box: DockerSandbox, direct: DockerSandbox
) -> None:
    assert box.uses_channel
    assert not direct.uses_channel
    for command in SAME_EVERYWHERE:
        started = time.monotonic()
        via_docker = await bash(direct, command, "standard")
        assert time.monotonic() - started < 30  # the background sleep is not awaited
        assert via_docker == await bash(box, command, "standard"), command
    await bash(box, "pkill -f 'sleep 1013'", "standard")
    await bash(direct, "pkill -f 'sleep 1013'", "standard")


@pytest.mark.parametrize("which", ["channel", "docker exec"])
async def test_a_background_writer_gets_sigpipe_once_the_call_returned(
    box: DockerSandbox, direct: DockerSandbox, which: str
) -> None:
    target = box if which == "channel" else direct
    writer = "bash -c 'sleep 1; while echo tick; do sleep 0.1; done' sigpipe-probe &"
    result = await bash(target, f"{writer} echo started", "standard")
    assert result.observation == "Exit code: 0\n" + HEADER + "\\[STDOUT]\nstarted\n"
    for _ in range(100):
        if "sigpipe-probe" not in await processes(target):
            break
        await asyncio.sleep(0.1)
    assert "sigpipe-probe" not in await processes(target)  # it died on its first late write


@pytest.mark.parametrize("which", ["channel", "docker exec"])
async def test_a_background_job_that_never_stops_writing_does_not_hold_the_call(
    box: DockerSandbox, direct: DockerSandbox, which: str
) -> None:
    target = box if which == "channel" else direct
    started = time.monotonic()
    result = await bash(target, "yes flood-probe & echo started", "standard", timeout_s=60)
    assert time.monotonic() - started < 30  # far below the 60 s timeout: not held open
    assert result.exit_code == 0
    assert result.observation.startswith("Exit code: 0\n" + HEADER + "\\[STDOUT]\n")
    assert "flood-probe" in result.observation  # what it wrote within the grace
    for _ in range(100):
        if "flood-probe" not in await processes(target):
            break
        await asyncio.sleep(0.1)
    assert "flood-probe" not in await processes(target)  # SIGPIPE once the call returned
