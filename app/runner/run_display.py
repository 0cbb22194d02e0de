"""How `sandhive run` shows an episode in a terminal: steps as they happen, then a summary.

Steps are numbered from 1, as the page and the reference package number them.
A command is shown as the shell line it is, an edit as the diff it makes (a
created file as its first lines), so a run reads like a terminal session rather
than a dump of JSON. The model's text and a command's output are printed as they
stream (whole lines, so stdout and stderr cannot tear each other's lines), and
what was already streamed is not printed again when the step completes. Model
and tool text is never read as Rich markup. Colours come only when the console
is a terminal (Rich decides), so piped output stays plain text.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from app.agent.types import Action, Outcome, Step

HEAD_LINES = 12
"""A created file, a long observation or answer: shown up to this many lines, then a count."""
DIFF_LINES = 40
OBSERVATION_TAIL = 4
REASONING_CHARS = 2000
GUTTER = Text("│ ", style="dim")
_TOOL_HEADER = re.compile(r"^Execution output of \\\[\w+\]:\n?", re.MULTILINE)
_EDITS = {"create", "str_replace", "insert"}


def step_number(index: int) -> int:
    """The number a person sees: the page's and the package's (`index + 1`)."""
    return index + 1


class TerminalSink:
    """Prints each step as it happens; implements app.agent.types.EventSink."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._streamed: set[str] = set()
        self._announced = False
        self._partial: dict[str, str] = {}

    async def step_started(self, index: int) -> None:
        self._streamed, self._announced, self._partial = set(), False, {}
        self.console.rule(Text(f"Step {step_number(index)}", style="bold"))

    async def live(self, kind: str, data: Mapping[str, object]) -> None:
        if kind == "llm.delta":
            for key in ("reasoning", "text"):
                if isinstance(data.get(key), str):
                    self._stream(key, str(data[key]))
        elif kind == "tool.started":
            self._flush_partial()
            arguments = data.get("arguments")
            if isinstance(arguments, dict):
                self.console.print(action_view(Action(str(data.get("tool")), arguments)))
                self._announced = True
        elif kind == "tool.output":
            stream, chunk = data.get("stream"), data.get("chunk")
            if isinstance(stream, str) and isinstance(chunk, str):
                self._stream(stream, chunk)

    async def step_completed(self, step: Step, next_index: int | None = None) -> None:
        self._flush_partial()
        if step.reasoning and "reasoning" not in self._streamed:
            self._print_lines(step.reasoning[:REASONING_CHARS], "reasoning")
        if step.thought and "text" not in self._streamed:
            self._print_lines(step.thought, "text")
        if step.action is not None and not self._announced:
            self.console.print(action_view(step.action))
        observation = observation_view(step, output_streamed=bool(self._streamed & _OUTPUT))
        if observation is not None:
            self.console.print(observation)
        self.console.print(step_footer(step))
        if next_index is not None:
            await self.step_started(next_index)

    def _stream(self, key: str, chunk: str) -> None:
        """Print the whole lines of `chunk` now; keep a trailing partial line for later."""
        if not chunk:
            return
        self._streamed.add(key)
        # A model's reasoning and text take turns: end the other's line first. Output
        # streams run side by side: each keeps its partial line until it is whole.
        for other in [k for k in self._partial if k != key and not {k, key} <= _OUTPUT]:
            self._print_lines(self._partial.pop(other), other)
        text = self._partial.pop(key, "") + chunk
        whole, _, rest = text.rpartition("\n")
        if rest:
            self._partial[key] = rest
        if whole or text.endswith("\n"):
            self._print_lines(whole, key)

    def _flush_partial(self) -> None:
        for key, text in self._partial.items():
            self._print_lines(text, key)
        self._partial = {}

    def _print_lines(self, text: str, key: str) -> None:
        for line in text.split("\n"):
            line = line.rsplit("\r", 1)[-1]  # a progress bar's last state, not every redraw
            if key in _OUTPUT:
                style = "red" if key == "stderr" else ""
                self.console.print(Text.assemble(GUTTER, Text(line, style=style)))
            else:
                self.console.print(Text(line, style=_TEXT_STYLES.get(key, "")))


_OUTPUT = {"stdout", "stderr"}
_TEXT_STYLES = {"reasoning": "dim italic", "text": ""}


def action_view(action: Action) -> RenderableType:
    """A command as its shell line, an edit as a diff, a created file as its head."""
    args = action.arguments
    if action.tool == "execute_bash" and isinstance(args.get("command"), str):
        return Text.assemble(("$ ", "bold green"), _highlight(args["command"], "bash"))
    if action.tool == "str_replace_editor" and isinstance(args.get("path"), str):
        command, path = str(args.get("command", "")), args["path"]
        if command in _EDITS:
            header = Text.assemble((f"{command} ", "bold yellow"), (path, "bold"))
            return Group(header, _highlight("\n".join(edit_diff(command, path, args)), "diff"))
        return Text.assemble((f"{command or 'editor'} ", "bold yellow"), (path, "bold"))
    if action.tool == "submit":
        return Text("submit", style="bold magenta")
    shown = json.dumps(args, ensure_ascii=False)
    return Text.assemble((f"{action.tool} ", "bold cyan"), shown[:300])


def edit_diff(command: str, path: str, args: Mapping[str, Any]) -> list[str]:
    """A unified diff of the edit: old_str → new_str, an insert's lines, a new file's head."""
    if command == "str_replace":
        old, new = _text(args.get("old_str")), _text(args.get("new_str"))
        diff = difflib.unified_diff(
            old.splitlines(), new.splitlines(), f"a{path}", f"b{path}", lineterm="", n=3
        )
        return _capped(list(diff), DIFF_LINES)
    lines = _text(args.get("new_str" if command == "insert" else "file_text")).splitlines()
    where = f"after line {args.get('insert_line', 0)}" if command == "insert" else "new file"
    count = f"{len(lines)} line" + ("" if len(lines) == 1 else "s")
    head = [f"@@ {where}, {count} @@", *(f"+{line}" for line in lines)]
    return _capped(head, HEAD_LINES + 1)


def observation_view(step: Step, *, output_streamed: bool) -> Text | None:
    """What the tool answered, unless the step already showed it (streamed output, the diff
    of a successful edit shows the change: then only the observation's first line)."""
    text = _TOOL_HEADER.sub("", step.observation, count=1).strip("\n")
    action = step.action
    if not text or (output_streamed and step.exit_code is not None):
        return None
    if action is not None and action.tool == "str_replace_editor":
        first = text.split("\n", 1)[0]
        if action.arguments.get("command") in _EDITS and not first.startswith("Error"):
            return Text(_first_sentence(first), style="dim")
    lines = _head_and_tail(text.split("\n"), HEAD_LINES, OBSERVATION_TAIL)
    return Text("\n".join(lines), style="green" if action is not None else "dim")


def step_footer(step: Step) -> Text:
    """The step's exit status, model and tool time, and tokens, on one line."""
    parts: list[Text] = []
    if step.exit_code is not None:
        ok = step.exit_code == 0
        parts.append(Text(f"exit {step.exit_code}", style="green" if ok else "bold red"))
    if step.interrupted:
        parts.append(Text(f"interrupted: {step.interrupted}", style="bold yellow"))
    parts.append(Text(f"model {duration(step.llm_ms / 1000)}"))
    if step.action is not None:
        parts.append(Text(f"tool {duration(step.tool_ms / 1000)}"))
    parts.append(Text(f"tokens {step.prompt_tokens:,} in / {step.completion_tokens:,} out"))
    return Text(" · ", style="dim").join(parts)


@dataclass(frozen=True)
class Summary:
    """What the closing panel shows: how the run ended and what it cost."""

    outcome: Outcome
    answer: str | None
    elapsed_s: float


def summary_panel(summary: Summary) -> Panel:
    """The closing panel: the answer first, then how the run ended, its time and tokens.

    `label: value` lines (not an aligned grid), so each reads and greps on its own.
    """
    outcome, usage = summary.outcome, summary.outcome.usage
    lines: list[Text] = []
    if summary.answer is not None:
        answer = _head_and_tail(summary.answer.rstrip("\n").split("\n"), HEAD_LINES, 2)
        lines.append(_row("answer", answer[0] if len(answer) == 1 else "", "bold"))
        lines.extend(Text(line) for line in answer if len(answer) > 1)
    reason = outcome.finish_reason.value
    ended = f"{reason} ({len(outcome.steps)} steps)"
    lines.append(_row("finish_reason", ended, "green" if reason == "submitted" else "bold red"))
    if outcome.error:
        lines.append(_row("error", outcome.error, "red"))
    spent = f"{duration(summary.elapsed_s)} (model {duration(usage.llm_seconds)}"
    if any(step.action is not None for step in outcome.steps):
        spent += f", tools {duration(usage.sandbox_seconds)}"
    lines.append(_row("time", spent + ")"))
    total = usage.prompt_tokens + usage.completion_tokens
    used = f"{total:,} ({usage.prompt_tokens:,} in / {usage.completion_tokens:,} out)"
    lines.append(_row("tokens", used))
    return Panel(Text("\n").join(lines), title=Text("finished", style="bold"), title_align="left")


def _row(label: str, value: str, style: str = "") -> Text:
    return Text.assemble((f"{label}:", "bold"), " " if value else "", (value, style))


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def _highlight(code: str, lexer: str) -> Text:
    """Syntax colours as a Text (no padding or background); plain when colour is off."""
    text = Syntax(code, lexer, theme="ansi_dark").highlight(code)
    text.rstrip()
    return text


def _text(value: object) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def _capped(lines: list[str], limit: int) -> list[str]:
    if len(lines) <= limit:
        return lines
    return [*lines[:limit], f"… {len(lines) - limit} more lines"]


def _head_and_tail(lines: Sequence[str], head: int, tail: int) -> list[str]:
    if len(lines) <= head + tail + 1:
        return list(lines)
    hidden = len(lines) - head - tail
    return [*lines[:head], f"… {hidden} lines not shown …", *lines[len(lines) - tail :]]


def _first_sentence(line: str) -> str:
    """`File created at X.` out of the editor's `File created at X. Here's the result of …`."""
    end = line.find(". ")
    return line if end < 0 else line[: end + 1]
