"""The `execute_bash` tool: one fresh shell per call, output shaped like the reference.

Imported only by `app.agent.tools`. `reference` runs the package's exact command
line (`timeout T bash -c <quoted>`) and reproduces its observation byte for byte;
`standard` keeps the layout but keeps partial output on timeout, caps bytes as
well as lines, and returns as soon as the command ends even if a background job
still holds its output (that job gets SIGPIPE on its next write instead).
On timeout the sandbox driver SIGKILLs every process the call started.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from app.agent.truncate import cap_bytes, clean, truncate_lines
from app.agent.types import OutputCallback, Sandbox

NO_COMMAND = "Error: No command provided."
REFERENCE_GRACE_S = 1.0
"""The package's `timeout` only sends SIGTERM; past T + this the driver SIGKILLs the call."""

# Run the command with its stdout/stderr going through two `cat` relays we own, so
# that when the command exits we can stop relaying even if a background child
# still holds the pipes (otherwise the exec would only end when that child does).
STANDARD_WRAPPER = """
exec 3> >(exec cat)
relay_out=$!
exec 4> >(exec cat >&2 3>&-)
relay_err=$!
bash -c "$1" >&3 2>&4 3>&- 4>&-
rc=$?
exec 3>&- 4>&-
for _ in {1..100}; do
  kill -0 "$relay_out" "$relay_err" 2>/dev/null || break
  sleep 0.005
done
kill "$relay_out" "$relay_err" 2>/dev/null
exit "$rc"
"""


@dataclass(frozen=True)
class BashOutcome:
    observation: str
    exit_code: int | None


def timeout_message(timeout_s: int) -> str:
    return f"The command took too long to execute (>{timeout_s}s)"


def format_output(code: str, stdout: str, stderr: str) -> str:
    """The package's layout: exit code line, header, STDOUT, and STDERR only when non-blank."""
    parts = [f"Exit code: {code}", "Execution output of \\[execute_bash]:"]
    parts.append("\\[STDOUT]\n" + (stdout if stdout.strip() else ""))
    if stderr.strip():
        parts.append(f"\\[STDERR]\n{stderr}")
    return "\n".join(parts)


def exit_code_text(code: int) -> str:
    return "0" if code == 0 else f"Error: Exit code {code}"


async def run_bash(
    box: Sandbox,
    command: str,
    *,
    profile: str,
    workdir: str,
    timeout_s: int,
    on_output: OutputCallback | None = None,
) -> BashOutcome:
    """Run one command in a fresh shell and describe the result for the model."""
    if not command:
        return BashOutcome(NO_COMMAND, None)
    if profile == "reference":
        return await _run_reference(box, command, workdir, timeout_s, on_output)
    return await _run_standard(box, command, workdir, timeout_s, on_output)


async def _run_reference(
    box: Sandbox, command: str, workdir: str, timeout_s: int, on_output: OutputCallback | None
) -> BashOutcome:
    argv = ["bash", "-c", f"timeout {timeout_s} bash -c {shlex.quote(command)}"]
    result = await box.exec(
        argv, workdir=workdir, timeout_s=timeout_s + REFERENCE_GRACE_S, on_output=on_output
    )
    if result.timed_out or result.exit_code == 124:
        # The package discards whatever the command printed before the timeout.
        return BashOutcome(format_output("-1", timeout_message(timeout_s), ""), -1)
    stdout = truncate_lines(clean(result.stdout))
    stderr = truncate_lines(clean(result.stderr))
    return BashOutcome(
        format_output(exit_code_text(result.exit_code), stdout, stderr), result.exit_code
    )


async def _run_standard(
    box: Sandbox, command: str, workdir: str, timeout_s: int, on_output: OutputCallback | None
) -> BashOutcome:
    argv = ["bash", "-c", STANDARD_WRAPPER, "bash", command]
    result = await box.exec(argv, workdir=workdir, timeout_s=timeout_s, on_output=on_output)
    stdout = cap_bytes(truncate_lines(clean(result.stdout)))
    stderr = cap_bytes(truncate_lines(clean(result.stderr)))
    if result.timed_out:
        separator = "\n" if stdout and not stdout.endswith("\n") else ""
        stdout = f"{stdout}{separator}{timeout_message(timeout_s)}"
        return BashOutcome(format_output("-1", stdout, stderr), -1)
    return BashOutcome(
        format_output(exit_code_text(result.exit_code), stdout, stderr), result.exit_code
    )
