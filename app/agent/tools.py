"""The agent's three tools: their schemas, argument checks and dispatch.

Imported by `app.agent.loop` (and tests). Two profiles: `reference` answers every
call exactly as the paper's package does (REFERENCE.md §1.4, golden file);
`standard` (the default) keeps the same layout with the package's bugs fixed.
Build one `ToolContext` per task and reuse it: it carries the undo history.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from app import defaults
from app.agent.bash import SHELLS, run_bash
from app.agent.editor import EditHistory, run_editor
from app.agent.types import OutputCallback, Sandbox, ToolCall, ToolSchema

PROFILES = ("reference", "standard")
SUBMIT_OBSERVATION = "<<< Finished >>>"
NO_TOOL_CALL_NUDGE = (
    "\nYou forgot to use a function call in your response. \n"
    "YOU MUST USE A FUNCTION CALL IN EACH RESPONSE.\n\n"
    "IMPORTANT: YOU SHOULD NEVER ASK FOR HUMAN HELP.\n"
)
"""The package's continue message (`CONTINUE_MSG`, with its trailing space after "response."),
sent as a user message when a turn has no tool call."""
NAMELESS_CALL = (
    "Error: the tool call has no function name; call one of execute_bash, "
    "str_replace_editor or submit."
)


@dataclass(frozen=True)
class ToolResult:
    observation: str
    """Exactly the text the model receives (before the loop's "Steps Remaining" suffix)."""
    exit_code: int | None = None
    """execute_bash's exit code, -1 on timeout; None for other tools or when nothing ran."""
    done: bool = False
    """True for submit."""


@dataclass(frozen=True)
class ToolContext:
    box: Sandbox
    profile: str
    workdir: str = defaults.WORKDIR
    command_timeout_s: int = defaults.COMMAND_TIMEOUT_S
    on_output: OutputCallback | None = None
    edits: EditHistory = field(default_factory=EditHistory, compare=False)
    """Standard profile's undo stacks; lives as long as this context (one task)."""
    shell: str = "fresh"
    """execute_bash: a "fresh" shell per call, or one "persistent" shell (standard only)."""
    session: str = field(default_factory=lambda: uuid.uuid4().hex, compare=False)
    """This context's persistent shell, when it has one."""

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"unknown tools profile {self.profile!r}; expected one of {PROFILES}")
        check_shell(self.profile, self.shell)


def check_shell(profile: str, shell: str) -> None:
    if shell not in SHELLS:
        raise ValueError(f"unknown shell {shell!r}; expected one of {SHELLS}")
    if shell == "persistent" and profile == "reference":
        raise ValueError("the reference profile runs a fresh shell per call, not a persistent one")


def tool_schemas(profile: str, shell: str = "fresh") -> list[ToolSchema]:
    """The three tools in OpenAI function-calling form, in the package's order."""
    if profile not in PROFILES:
        raise ValueError(f"unknown tools profile {profile!r}; expected one of {PROFILES}")
    check_shell(profile, shell)
    return [_editor_schema(profile), _bash_schema(shell), _submit_schema()]


def is_no_call(call: ToolCall, profile: str) -> bool:
    """Reference only: the package treats a nameless call or unparsable arguments as no call."""
    if profile != "reference":
        return False
    return not call.name or (call.arguments is None and not _decodes(call.raw_arguments))


async def run_tool(call: ToolCall, ctx: ToolContext) -> ToolResult:
    """Execute one tool call in the sandbox and describe the result for the model."""
    args = call.arguments
    if args is None and ctx.profile == "standard" and not call.raw_arguments.strip():
        args = {}  # many models send "" for a call without parameters
    if args is None or is_no_call(call, ctx.profile):
        return _not_an_object(call, ctx.profile)
    if not call.name:  # standard only: the reference profile took it for no call above
        return ToolResult(NAMELESS_CALL)
    if call.name == "execute_bash":
        command = args.get("command")
        outcome = await run_bash(
            ctx.box,
            "" if not command else str(command),
            profile=ctx.profile,
            workdir=ctx.workdir,
            timeout_s=ctx.command_timeout_s,
            on_output=ctx.on_output,
            session=ctx.session if ctx.shell == "persistent" else None,
        )
        return ToolResult(outcome.observation, outcome.exit_code)
    if call.name == "str_replace_editor":
        text = await run_editor(
            ctx.box,
            args,
            profile=ctx.profile,
            workdir=ctx.workdir,
            timeout_s=ctx.command_timeout_s,
            history=ctx.edits,
        )
        return ToolResult(text)
    if call.name == "submit":
        return ToolResult(SUBMIT_OBSERVATION, done=True)
    return ToolResult(f"Unknown action: {call.name}")


def _decodes(raw: str) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


def _not_an_object(call: ToolCall, profile: str) -> ToolResult:
    """Arguments that are not a JSON object: the package's odd answers, or a clear error."""
    if call.name == "submit":
        return ToolResult(SUBMIT_OBSERVATION, done=True)
    if profile == "standard":
        if call.name not in {"execute_bash", "str_replace_editor"}:
            return ToolResult(f"Unknown action: {call.name}")
        raw = call.raw_arguments[:500]
        return ToolResult(f"Error: the arguments of {call.name} must be a JSON object, got: {raw}")
    if is_no_call(call, profile):
        return ToolResult(NO_TOOL_CALL_NUDGE)
    if call.name == "execute_bash":
        return ToolResult("Exit code: 0\nExecution output of \\[execute_bash]:\n")
    return ToolResult(f"Execution output of \\[{call.name}]:\n")


# ---------------------------------------------------------------- schemas (Sandhive's wording)


def _function(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> ToolSchema:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


EDITOR_COMMON = """Look at, create and change files in the sandbox.
* Files persist between calls (and between tools).
* `view` on a file shows it numbered like `cat -n`; `view_range` picks lines. `view` on a \
directory lists what it holds up to 2 levels deep, hidden entries excluded.
* Long results are cut and end with `<response clipped>`; search with `grep -n` and view a range.
* `str_replace` swaps `old_str` for `new_str`. `old_str` must occur exactly once in the file and \
match it exactly, spaces and indentation included; add surrounding lines to make it unique.
* `insert` puts `new_str` after line `insert_line` (0 = at the top)."""

EDITOR_REFERENCE = (
    EDITOR_COMMON
    + """
* `view` shows only .py and .rst files (and directory listings show only those).
* `create` writes `file_text` to a new file at `path`, creating parent directories; it is not \
meant for files that already exist."""
)

EDITOR_STANDARD = (
    EDITOR_COMMON
    + """
* `view` works on any text file.
* `create` writes `file_text` to a new file at `path`, creating parent directories; it refuses \
to overwrite an existing file.
* `undo_edit` reverts the latest `str_replace` or `insert` on `path` (repeatable)."""
)


def _editor_schema(profile: str) -> ToolSchema:
    commands = ["view", "create", "str_replace", "insert"]
    if profile == "standard":
        commands.append("undo_edit")
    properties: dict[str, Any] = {
        "command": {"type": "string", "enum": commands, "description": "What to do."},
        "path": {"type": "string", "description": "Absolute path, e.g. `/testbed/script.py`."},
        "file_text": {"type": "string", "description": "`create`: the content of the new file."},
        "old_str": {"type": "string", "description": "`str_replace`: the exact text to replace."},
        "new_str": {
            "type": "string",
            "description": "`str_replace`: the replacement; `insert`: the text to insert.",
        },
        "insert_line": {
            "type": "integer",
            "description": "`insert`: the line after which `new_str` goes (0 = before line 1).",
        },
        "view_range": {
            "type": "array",
            "items": {"type": "integer"},
            "description": "`view` of a file: [first, last] lines, 1-based; last = -1 for the end.",
        },
    }
    description = EDITOR_REFERENCE if profile == "reference" else EDITOR_STANDARD
    return _function("str_replace_editor", description, properties, ["command", "path"])


BASH_DESCRIPTION = """Run a bash command in the sandbox; returns its exit code, stdout and stderr.
* Every call starts a new shell in the working directory: `cd`, exported variables and activated \
environments do not carry over to the next call, but files and installed packages do.
* A command that runs past the time limit is stopped; start long jobs in the background with \
their output sent to a file (`nohup cmd > log.txt 2>&1 &`) and check on them later.
* Long output keeps only its first and last 40 lines."""


BASH_PERSISTENT_DESCRIPTION = """Run a bash command in the sandbox; returns its exit code, stdout \
and stderr.
* All calls run in one shell session, started in the working directory: `cd`, variables, \
functions and activated environments carry over to the next call. Exiting the shell starts a \
new one.
* A command that runs past the time limit is stopped; start long jobs in the background with \
their output sent to a file (`nohup cmd > log.txt 2>&1 &`) and check on them later.
* Long output keeps only its first and last 40 lines."""


def _bash_schema(shell: str) -> ToolSchema:
    properties = {"command": {"type": "string", "description": "The bash command to run."}}
    description = BASH_PERSISTENT_DESCRIPTION if shell == "persistent" else BASH_DESCRIPTION
    return _function("execute_bash", description, properties, ["command"])


def _submit_schema() -> ToolSchema:
    description = (
        "Finish the task. Save your answer and any output files in the output directory first; "
        "this call takes no arguments."
    )
    return _function("submit", description, {}, [])
