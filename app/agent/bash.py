"""The `execute_bash` tool: a fresh shell per call (or a persistent one), shaped like the reference.

Imported only by `app.agent.tools`. `reference` runs the package's exact command
line (`timeout T bash -c <quoted>`) and reproduces its observation byte for byte;
`standard` keeps the layout but keeps partial output on timeout, caps bytes as
well as lines, and returns as soon as the command ends even if a background job
still holds its output (that job gets SIGPIPE on its next write instead).
`standard` with shell "persistent" runs every call in one bash kept for the task,
so `cd`, variables and functions carry over.
On timeout the sandbox driver SIGKILLs every process the call started.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from app.agent.truncate import cap_bytes, clean, truncate_lines
from app.agent.types import ExecResult, OutputCallback, Sandbox

NO_COMMAND = "Error: No command provided."
REFERENCE_GRACE_S = 1.0
"""The package's `timeout` only sends SIGTERM; past T + this the driver SIGKILLs the call."""
LINGER_S = 0.5
"""`standard`: output a background job prints this soon after the command ends still counts."""
SHELLS = ("fresh", "persistent")
NO_SESSION = (
    "Error: this sandbox cannot keep a persistent shell (its in-sandbox command runner "
    "is not available), so the command was not run."
)
SESSION_ENDED = "(The shell session ended; the next command starts a new shell in {workdir}.)"


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
    session: str | None = None,
) -> BashOutcome:
    """Run one command and describe the result for the model.

    session: `standard` only, run it in that persistent shell instead of a fresh one.
    """
    if not command:
        return BashOutcome(NO_COMMAND, None)
    if profile == "reference":
        return await _run_reference(box, command, workdir, timeout_s, on_output)
    if session is None:
        result = await box.exec(
            ["bash", "-c", command],
            workdir=workdir,
            timeout_s=timeout_s,
            on_output=on_output,
            linger_s=LINGER_S,
        )
    else:
        found = await box.shell(
            session,
            command,
            workdir=workdir,
            timeout_s=timeout_s,
            on_output=on_output,
            linger_s=LINGER_S,
        )
        if found is None:
            return BashOutcome(NO_SESSION, None)
        result = found
    return _standard_outcome(result, workdir, timeout_s)


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


def _standard_outcome(result: ExecResult, workdir: str, timeout_s: int) -> BashOutcome:
    stdout = cap_bytes(truncate_lines(clean(result.stdout)))
    stderr = cap_bytes(truncate_lines(clean(result.stderr)))
    notes = [timeout_message(timeout_s)] if result.timed_out else []
    if result.session_ended:
        notes.append(SESSION_ENDED.format(workdir=workdir))
    if notes:
        separator = "\n" if stdout and not stdout.endswith("\n") else ""
        stdout = separator.join([stdout, "\n".join(notes)])
    code = -1 if result.timed_out else result.exit_code
    text = "-1" if result.timed_out else exit_code_text(code)
    return BashOutcome(format_output(text, stdout, stderr), code)
