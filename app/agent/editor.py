"""The `str_replace_editor` tool: view, create, str_replace, insert (and undo_edit in standard).

Imported only by `app.agent.tools`. The logic runs here, host-side; the sandbox is
reached only through `Sandbox.exec`, with paths passed as argv (never spliced into
a shell string) and file contents sent on stdin. `reference` reproduces the
package's results, quirks included (REFERENCE.md §1.4: .py/.rst-only views, tab
expansion, a newline added by every write, `create` overwriting); `standard`
fixes them and keeps an in-memory undo stack per path (`EditHistory`, one per task).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.agent.truncate import clean, clip
from app.agent.types import ExecResult, Sandbox

PREFIX = "Execution output of \\[str_replace_editor]:\n"
SNIPPET_LINES = 4
LISTING_LIMIT = 100
MAX_EDIT_BYTES = 8 * 2**20
"""Standard: larger files are refused (the sandbox driver keeps only 16 MiB of a stream)."""
UNDO_DEPTH = 10
UNDO_MAX_CHARS = 32 * 2**20

LISTING_HEADER = "Here's the files and directories up to 2 levels deep in {}, excluding hidden:\n"
REVIEW_CREATE = "Review the file and make sure that it is as expected. Edit the file if necessary."
REVIEW_EDIT = (
    "Review the changes and make sure they are as expected. Edit the file again if necessary."
)
REVIEW_INSERT = (
    "Review the changes and make sure they are as expected (correct indentation, "
    "no duplicate lines, etc). Edit the file again if necessary."
)

PROBE = (
    'if [ -d "$1" ]; then echo dir; elif [ -f "$1" ]; then echo "file $(stat -c %s -- "$1")"; '
    'elif [ -e "$1" ]; then echo other; else echo missing; fi'
)
READ = 'cat -- "$1"'
WRITE = 'cat > "$1"'
CREATE = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
CREATE_NEW = 'mkdir -p -- "$(dirname -- "$1")" && set -C && cat > "$1"'
FIND_REFERENCE = (
    "find \"$1\" -maxdepth 2 -not -path '*/.*' "
    "\\( -type d -o -name '*.py' -o -name '*.rst' \\) | head -100"
)
FIND_ALL = 'find "$1" -maxdepth 2 -print0'

_ECHO_OPTIONS = re.compile(r"-[neE]+")

Handler = Callable[[str, Mapping[str, Any]], Awaitable[str]]
"""One editor command: (path, arguments) -> result text (without the prefix)."""


class EditError(Exception):
    """A message for the model; raised deep, rendered once by `run_editor`."""


class EditHistory:
    """Previous contents per path, newest last: what `undo_edit` restores (standard only).

    Bounded: `depth` versions per path and `max_chars` in all; past the total, the
    oldest version of the largest history goes first (undo stops earlier, never goes wrong).
    """

    def __init__(self, depth: int = UNDO_DEPTH, max_chars: int = UNDO_MAX_CHARS) -> None:
        self._depth = depth
        self._max_chars = max_chars
        self._stacks: dict[str, list[str]] = {}
        self._chars = 0

    def push(self, path: str, content: str) -> None:
        stack = self._stacks.setdefault(path, [])
        stack.append(content)
        self._chars += len(content)
        while len(stack) > self._depth:
            self._chars -= len(stack.pop(0))
        while self._chars > self._max_chars:
            oldest = max(self._stacks.values(), key=lambda versions: sum(map(len, versions)))
            self._chars -= len(oldest.pop(0))

    def pop(self, path: str) -> str | None:
        stack = self._stacks.get(path)
        if not stack:
            return None
        content = stack.pop()
        self._chars -= len(content)
        return content


@dataclass(frozen=True)
class Files:
    """The sandbox's file system as the editor needs it, one exec per operation."""

    box: Sandbox
    workdir: str
    timeout_s: float

    async def sh(self, script: str, path: str, stdin: bytes | None = None) -> ExecResult:
        argv = ["bash", "-c", script, "bash", path]
        return await self.box.exec(
            argv, workdir=self.workdir, stdin=stdin, timeout_s=self.timeout_s
        )

    async def probe(self, path: str) -> tuple[str, int]:
        """("dir" | "file" | "other" | "missing", size in bytes for files)."""
        words = (await self.sh(PROBE, path)).stdout.decode(errors="replace").split()
        kind = words[0] if words else "missing"
        size = int(words[1]) if kind == "file" and len(words) > 1 and words[1].isdigit() else 0
        return kind, size


# ---------------------------------------------------------------- shared formatting


def numbered(lines: list[str], start: int) -> str:
    """`cat -n` style: 6-wide right-aligned line numbers and a tab."""
    return "\n".join(f"{i + start:6}\t{line}" for i, line in enumerate(lines))


def view_header(descriptor: str) -> str:
    return f"Here's the result of running `cat -n` on {descriptor}:\n"


def echo_bytes(text: str) -> bytes:
    """What bash's builtin `echo '<text>'` writes: a newline added, a lone option eaten."""
    if _ECHO_OPTIONS.fullmatch(text):
        return b"" if "n" in text else b"\n"
    return (text + "\n").encode()


def as_text(value: object) -> str:
    """A tool argument as a string; missing or null is empty."""
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def as_int(value: object, name: str) -> int:
    """An integer argument; numeric strings are accepted (some models quote numbers)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    raise EditError(f"Error: {name} must be an integer.")


def parse_range(view_range: object) -> tuple[int, int] | None:
    """The package shows the whole file unless view_range has exactly two items."""
    if not view_range or not isinstance(view_range, list | tuple) or len(view_range) != 2:
        return None
    return as_int(view_range[0], "view_range"), as_int(view_range[1], "view_range")


def slice_range(lines: list[str], view_range: tuple[int, int]) -> tuple[list[str], int]:
    """The lines to show and the first line number, or the package's range errors."""
    start, end = view_range
    total = len(lines)
    shown = f"[{start}, {end}]"
    if not 1 <= start <= total:
        raise EditError(f"Error: Invalid view_range {shown}: start line must be in [1, {total}]")
    if end != -1 and (end < start or end > total):
        raise EditError(
            f"Error: Invalid view_range {shown}: end must be >= start and <= {total}, "
            "or -1 to view until end."
        )
    return (lines[start - 1 :] if end == -1 else lines[start - 1 : end]), start


def edit_snippet(lines: list[str], line: int, added_newlines: int) -> tuple[list[str], int]:
    """The lines around a replacement starting at 0-based `line`, and the first number."""
    first = max(0, line - SNIPPET_LINES)
    last = line + SNIPPET_LINES + added_newlines
    return lines[first : last + 1], first + 1


def count_matches(path: str, text: str, old: str) -> None:
    occurrences = text.count(old)
    if occurrences == 0:
        raise EditError(f"Error: No occurrences of old_str found in {path} for replacement.")
    if occurrences > 1:
        raise EditError(
            f"Error: Multiple occurrences ({occurrences}) of old_str found in {path}. "
            "Please ensure it is unique before using str_replace."
        )


# ---------------------------------------------------------------- reference profile


@dataclass(frozen=True)
class ReferenceEditor:
    """The package's editor, result for result."""

    files: Files

    def handlers(self) -> dict[str, Handler]:
        return {
            "view": self.view,
            "create": self.create,
            "str_replace": self.str_replace,
            "insert": self.insert,
        }

    async def read(self, path: str) -> str:
        # The package reads with `cat` through a merged-output exec: an error message
        # becomes the "content", and carriage returns are stripped.
        result = await self.files.sh(READ, path)
        return clean(result.stdout + result.stderr)

    def make_output(self, text: str, descriptor: str, start: int = 1) -> str:
        lines = clip(text).expandtabs().split("\n")
        return view_header(descriptor) + numbered(lines, start) + "\n"

    async def view(self, path: str, args: Mapping[str, Any]) -> str:
        kind, _ = await self.files.probe(path)
        if kind == "dir":
            found = await self.files.sh(FIND_REFERENCE, path)
            listing = clean(found.stdout + found.stderr)
            return (
                LISTING_HEADER.format(path) + listing if listing else f"(empty directory: {path})"
            )
        if kind != "file":
            return f"Error: Path not found: {path}"
        if not path.endswith((".py", ".rst")):
            return (
                "ERROR: Viewing non-Python files is disallowed for saving context. "
                f"File '{path}' is not a .py or .rst file."
            )
        text = await self.read(path)
        if not text:
            return f"(empty file: {path})"
        lines = text.expandtabs().split("\n")
        view_range = parse_range(args.get("view_range"))
        shown, start = slice_range(lines, view_range) if view_range else (lines, 1)
        return clip(view_header(path) + numbered(shown, start))

    async def create(self, path: str, args: Mapping[str, Any]) -> str:
        text = str(args.get("file_text", ""))
        result = await self.files.sh(CREATE, path, echo_bytes(text))
        if result.exit_code != 0:
            return f"Error creating file: {clean(result.stdout + result.stderr)}"
        return f"File created at {path}. " + self.make_output(text, path) + REVIEW_CREATE

    async def write(self, path: str, text: str) -> None:
        result = await self.files.sh(WRITE, path, echo_bytes(text))
        if result.exit_code != 0:
            raise EditError(f"Error writing file: {path}")

    async def str_replace(self, path: str, args: Mapping[str, Any]) -> str:
        old = as_text(args.get("old_str"))
        if not old:
            return "Error: old_str is required for str_replace."
        text = await self.read(path)
        if not text:
            return f"Error: Could not read file {path}"
        text, old = text.expandtabs(), old.expandtabs()
        new = as_text(args.get("new_str")).expandtabs()
        count_matches(path, text, old)
        line = text.split(old)[0].count("\n")
        new_text = text.replace(old, new, 1)
        await self.write(path, new_text)
        snippet, start = edit_snippet(new_text.split("\n"), line, new.count("\n"))
        body = self.make_output("\n".join(snippet), f"a snippet of {path}", start)
        return f"The file {path} has been edited. {body}{REVIEW_EDIT}"

    async def insert(self, path: str, args: Mapping[str, Any]) -> str:
        new = as_text(args.get("new_str"))
        if not new:
            return "Error: new_str is required for insert."
        at = as_int(args.get("insert_line", 0), "insert_line")
        text = (await self.read(path)).expandtabs()
        lines = text.split("\n") if text else []
        if at < 0 or at > len(lines):
            return f"Error: Invalid insert_line {at}. Must be in [0, {len(lines)}]."
        new_lines = new.expandtabs().split("\n")
        await self.write(path, "\n".join(lines[:at] + new_lines + lines[at:]))
        snippet = (
            lines[max(0, at - SNIPPET_LINES) : at] + new_lines + lines[at : at + SNIPPET_LINES]
        )
        body = self.make_output("\n".join(snippet), "a snippet of the edited file", max(1, at - 3))
        return f"The file {path} has been edited. {body}{REVIEW_INSERT}"


# ---------------------------------------------------------------- standard profile


def text_lines(text: str) -> list[str]:
    """Lines as `cat -n` counts them: a final newline ends the last line, it adds none."""
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return lines


@dataclass(frozen=True)
class StandardEditor:
    """The same tool with the package's bugs fixed; any text file, exact bytes, undo."""

    files: Files
    history: EditHistory = field(default_factory=EditHistory)

    def handlers(self) -> dict[str, Handler]:
        return {
            "view": self.view,
            "create": self.create,
            "str_replace": self.str_replace,
            "insert": self.insert,
            "undo_edit": self.undo_edit,
        }

    def make_output(self, text: str, descriptor: str, start: int = 1) -> str:
        lines = text_lines(clip(text)) or [""]
        return view_header(descriptor) + numbered(lines, start) + "\n"

    def snippet_output(self, lines: list[str], descriptor: str, start: int) -> str:
        """Numbered file lines as they are: a blank last line of the snippet is a real
        line of the file and is shown (only a whole text's final newline adds none)."""
        shown = clip("\n".join(lines)).split("\n")
        return view_header(descriptor) + numbered(shown, start) + "\n"

    async def read(self, path: str) -> str:
        """The exact text of an existing regular file, or an error for the model."""
        kind, size = await self.files.probe(path)
        if kind == "missing":
            raise EditError(f"Error: Path not found: {path}")
        if kind != "file":
            raise EditError(f"Error: {path} is not a regular file.")
        if size > MAX_EDIT_BYTES:
            raise EditError(
                f"Error: {path} is too large for str_replace_editor ({size} bytes, limit "
                f"{MAX_EDIT_BYTES}); use execute_bash (grep -n, sed -n, python) instead."
            )
        return await self.read_file(path)

    async def read_file(self, path: str) -> str:
        result = await self.files.sh(READ, path)
        if result.exit_code != 0:
            raise EditError(f"Error: Could not read file {path}: {clean(result.stderr).strip()}")
        if b"\0" in result.stdout:
            raise EditError(
                f"Error: {path} looks like a binary file (it contains NUL bytes); "
                "inspect it with execute_bash instead (e.g. `file`, `xxd | head`)."
            )
        try:
            return result.stdout.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EditError(
                f"Error: {path} is not valid UTF-8 text ({exc.reason} at byte {exc.start}); "
                "edit it with execute_bash instead."
            ) from exc

    async def write(self, path: str, text: str, script: str = WRITE) -> None:
        result = await self.files.sh(script, path, text.encode())
        if result.exit_code != 0:
            raise EditError(f"Error: Could not write {path}: {clean(result.stderr).strip()}")

    async def view(self, path: str, args: Mapping[str, Any]) -> str:
        kind, _ = await self.files.probe(path)
        if kind == "dir":
            return await self.listing(path)
        text = await self.read(path)
        if not text:
            return f"(empty file: {path})"
        lines = text_lines(text)
        view_range = parse_range(args.get("view_range"))
        shown, start = slice_range(lines, view_range) if view_range else (lines, 1)
        return clip(view_header(path) + numbered(shown, start))

    async def listing(self, path: str) -> str:
        found = await self.files.sh(FIND_ALL, path)
        entries = [e.decode(errors="replace") for e in found.stdout.split(b"\0") if e]
        visible = [e for e in entries if not is_hidden(posixpath.relpath(e, path))]
        if not visible:
            return f"(empty directory: {path})"
        shown = sorted(sorted(visible, key=lambda e: (e.count("/"), e))[:LISTING_LIMIT])
        more = len(visible) - len(shown)
        note = f"... and {more} more entries not shown\n" if more > 0 else ""
        return LISTING_HEADER.format(path) + "\n".join(shown) + "\n" + note

    async def create(self, path: str, args: Mapping[str, Any]) -> str:
        text = as_text(args.get("file_text"))
        kind, _ = await self.files.probe(path)
        if kind != "missing":
            return (
                f"Error: File already exists at: {path}. Cannot overwrite files using command "
                "`create`; use `str_replace` or `insert` to change it."
            )
        await self.write(path, text, CREATE_NEW)
        return f"File created at {path}. " + self.make_output(text, path) + REVIEW_CREATE

    async def str_replace(self, path: str, args: Mapping[str, Any]) -> str:
        old = as_text(args.get("old_str"))
        if not old:
            return "Error: old_str is required for str_replace."
        new = as_text(args.get("new_str"))
        text = await self.read(path)
        count_matches(path, text, old)
        line = text.split(old)[0].count("\n")
        new_text = text.replace(old, new, 1)
        await self.write(path, new_text)
        self.history.push(path, text)
        # Context from the file's real lines: its final newline adds no empty line.
        snippet, start = edit_snippet(text_lines(new_text), line, new.count("\n"))
        body = self.snippet_output(snippet, f"a snippet of {path}", start)
        return f"The file {path} has been edited. {body}{REVIEW_EDIT}"

    async def insert(self, path: str, args: Mapping[str, Any]) -> str:
        new = as_text(args.get("new_str"))
        if not new:
            return "Error: new_str is required for insert."
        at = as_int(args.get("insert_line", 0), "insert_line")
        text = await self.read(path)
        lines = text_lines(text)
        if at < 0 or at > len(lines):
            return f"Error: Invalid insert_line {at}. Must be in [0, {len(lines)}]."
        new_lines = text_lines(new) or [""]
        ending = "\n" if text.endswith("\n") or not text else ""
        await self.write(path, "\n".join(lines[:at] + new_lines + lines[at:]) + ending)
        self.history.push(path, text)
        snippet = (
            lines[max(0, at - SNIPPET_LINES) : at] + new_lines + lines[at : at + SNIPPET_LINES]
        )
        body = self.snippet_output(snippet, "a snippet of the edited file", max(1, at - 3))
        return f"The file {path} has been edited. {body}{REVIEW_INSERT}"

    async def undo_edit(self, path: str, args: Mapping[str, Any]) -> str:
        previous = self.history.pop(path)
        if previous is None:
            return f"Error: No edit history found for {path}."
        await self.write(path, previous)
        return f"Last edit to {path} undone successfully. " + self.make_output(previous, path)


def is_hidden(relative: str) -> bool:
    return any(part.startswith(".") and part not in {".", ".."} for part in relative.split("/"))


async def run_editor(
    box: Sandbox,
    args: Mapping[str, Any],
    *,
    profile: str,
    workdir: str,
    timeout_s: float,
    history: EditHistory,
) -> str:
    """One editor call, rendered with the package's prefix."""
    command, path = as_text(args.get("command")), as_text(args.get("path"))
    if not command or not path:
        return PREFIX + "Error: command and path are required."
    files = Files(box, workdir, timeout_s)
    if profile == "reference":
        handlers = ReferenceEditor(files).handlers()
    else:
        handlers = StandardEditor(files, history).handlers()
    handler = handlers.get(command)
    if handler is None:
        return PREFIX + f"Unknown command: {command}"
    try:
        return PREFIX + await handler(path, args)
    except EditError as exc:
        return PREFIX + str(exc)
