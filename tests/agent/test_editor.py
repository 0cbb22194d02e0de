"""str_replace_editor in both profiles, in a real sandbox.

Reference cases not in the golden file take their expected strings from
REFERENCE.md §1.4; standard cases check each of the package's bugs is fixed.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.agent.editor import MAX_EDIT_BYTES, EditHistory
from app.agent.tools import ToolContext, run_tool
from app.agent.types import ToolCall
from app.sandbox import DockerSandbox

pytestmark = pytest.mark.asyncio(loop_scope="module")

PREFIX = "Execution output of \\[str_replace_editor]:\n"


@pytest.fixture(scope="module")
def contexts(box: DockerSandbox) -> dict[str, ToolContext]:
    """One context per profile, as the loop keeps one per task (it holds the undo history)."""
    return {p: ToolContext(box=box, profile=p) for p in ("reference", "standard")}


async def edit(ctx: ToolContext, **args: Any) -> str:
    result = await run_tool(ToolCall("call", "str_replace_editor", args), ctx)
    assert result.exit_code is None
    assert not result.done
    assert result.observation.startswith(PREFIX)
    return result.observation.removeprefix(PREFIX)


async def put(box: DockerSandbox, path: str, data: bytes) -> None:
    script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
    done = await box.exec(["sh", "-c", script, "sh", path], stdin=data)
    assert done.exit_code == 0, done.stderr


async def read(box: DockerSandbox, path: str) -> bytes:
    done = await box.exec(["cat", "--", path])
    assert done.exit_code == 0, done.stderr
    return done.stdout


# ---------------------------------------------------------------- reference


async def test_reference_refuses_to_view_other_file_types(
    box: DockerSandbox, contexts: dict[str, ToolContext]
) -> None:
    await put(box, "/testbed/ref1/notes.txt", b"hello\n")
    out = await edit(contexts["reference"], command="view", path="/testbed/ref1/notes.txt")
    assert out == (
        "ERROR: Viewing non-Python files is disallowed for saving context. "
        "File '/testbed/ref1/notes.txt' is not a .py or .rst file."
    )


async def test_reference_listing_shows_only_dirs_py_and_rst(
    box: DockerSandbox, contexts: dict[str, ToolContext]
) -> None:
    for name in ("a.py", "b.txt", "doc.rst", ".hidden.py", "deep/x/y.py", "sub/c.py"):
        await put(box, f"/testbed/ref2/{name}", b"")
    out = await edit(contexts["reference"], command="view", path="/testbed/ref2")
    header, *entries = out.rstrip("\n").split("\n")
    assert header == (
        "Here's the files and directories up to 2 levels deep in /testbed/ref2, excluding hidden:"
    )
    assert sorted(entries) == [
        "/testbed/ref2",
        "/testbed/ref2/a.py",
        "/testbed/ref2/deep",
        "/testbed/ref2/deep/x",
        "/testbed/ref2/doc.rst",
        "/testbed/ref2/sub",
        "/testbed/ref2/sub/c.py",
    ]
    hidden = await edit(contexts["reference"], command="view", path="/testbed/ref2/.git")
    assert hidden == "Error: Path not found: /testbed/ref2/.git"
    await put(box, "/testbed/.cache/z.py", b"")
    assert await edit(contexts["reference"], command="view", path="/testbed/.cache") == (
        "(empty directory: /testbed/.cache)"
    )


async def test_reference_zero_byte_file_and_a_long_listing(
    box: DockerSandbox, contexts: dict[str, ToolContext]
) -> None:
    # REFERENCE.md §1.4: an empty file -> "(empty file: <path>)"; a listing is `find ... |
    # head -100`, so a directory holding 120 subdirectories shows exactly 100 lines.
    await put(box, "/testbed/ref6/zero.py", b"")
    assert await edit(contexts["reference"], command="view", path="/testbed/ref6/zero.py") == (
        "(empty file: /testbed/ref6/zero.py)"
    )
    made = await box.exec(["bash", "-c", "mkdir -p /testbed/ref7/d{001..120}"])
    assert made.exit_code == 0, made.stderr
    out = await edit(contexts["reference"], command="view", path="/testbed/ref7")
    header = (
        "Here's the files and directories up to 2 levels deep in /testbed/ref7, excluding hidden:\n"
    )
    assert out.startswith(header)
    assert out.endswith("\n")  # find's own newline after the 100th line
    entries = out.removeprefix(header).removesuffix("\n").split("\n")
    assert len(entries) == 100
    every = {"/testbed/ref7"} | {f"/testbed/ref7/d{n:03}" for n in range(1, 121)}
    assert len(set(entries)) == 100
    assert set(entries) <= every


async def test_reference_error_messages(
    box: DockerSandbox, contexts: dict[str, ToolContext]
) -> None:
    ctx = contexts["reference"]
    await put(box, "/testbed/ref3/m.py", b"a = 1\na = 1\n")
    await put(box, "/testbed/ref3/empty.py", b"")
    path = "/testbed/ref3/m.py"
    assert await edit(ctx, command="view", path="/testbed/ref3/nope.py") == (
        "Error: Path not found: /testbed/ref3/nope.py"
    )
    assert await edit(ctx, command="view", path=path, view_range=[0, 2]) == (
        "Error: Invalid view_range [0, 2]: start line must be in [1, 3]"
    )
    assert await edit(ctx, command="str_replace", path=path, new_str="x") == (
        "Error: old_str is required for str_replace."
    )
    assert await edit(ctx, command="str_replace", path=path, old_str="a = 1") == (
        f"Error: Multiple occurrences (2) of old_str found in {path}. "
        "Please ensure it is unique before using str_replace."
    )
    assert await edit(ctx, command="str_replace", path=path, old_str="zzz") == (
        f"Error: No occurrences of old_str found in {path} for replacement."
    )
    assert await edit(ctx, command="str_replace", path="/testbed/ref3/empty.py", old_str="a") == (
        "Error: Could not read file /testbed/ref3/empty.py"
    )
    assert await edit(ctx, command="insert", path=path, insert_line=4, new_str="b") == (
        "Error: Invalid insert_line 4. Must be in [0, 3]."
    )
    assert await edit(ctx, command="undo_edit", path=path) == "Unknown command: undo_edit"
    assert await edit(ctx, path=path) == "Error: command and path are required."
    assert await read(box, path) == b"a = 1\na = 1\n"


async def test_reference_create_overwrites_and_reports_write_errors(
    box: DockerSandbox, contexts: dict[str, ToolContext]
) -> None:
    ctx = contexts["reference"]
    await put(box, "/testbed/ref4/keep.py", b"old\n")
    out = await edit(ctx, command="create", path="/testbed/ref4/keep.py", file_text="new")
    assert out.startswith("File created at /testbed/ref4/keep.py. ")
    assert await read(box, "/testbed/ref4/keep.py") == b"new\n"
    failed = await edit(ctx, command="create", path="/testbed/ref4", file_text="x")
    assert failed.startswith("Error creating file: ")
    assert "Is a directory" in failed


async def test_reference_expands_tabs_in_the_whole_file_on_edit(
    box: DockerSandbox, contexts: dict[str, ToolContext]
) -> None:
    await put(box, "/testbed/ref5/t.py", b"if x:\n\ty = 1\n\tz = 2\n")
    await edit(
        contexts["reference"],
        command="str_replace",
        path="/testbed/ref5/t.py",
        old_str="\ty = 1",
        new_str="\ty = 3",
    )
    assert await read(box, "/testbed/ref5/t.py") == b"if x:\n        y = 3\n        z = 2\n\n"


# ---------------------------------------------------------------- standard


async def test_standard_views_any_text_file_exactly(
    box: DockerSandbox, contexts: dict[str, ToolContext]
) -> None:
    await put(box, "/testbed/std1/notes.txt", b"a\tb\nc\n")
    out = await edit(contexts["standard"], command="view", path="/testbed/std1/notes.txt")
    assert out == (
        "Here's the result of running `cat -n` on /testbed/std1/notes.txt:\n     1\ta\tb\n     2\tc"
    )
    ranged = await edit(
        contexts["standard"], command="view", path="/testbed/std1/notes.txt", view_range=[2, -1]
    )
    assert ranged.endswith(":\n     2\tc")


async def test_standard_listing_shows_every_file_but_hidden_ones(
    box: DockerSandbox, contexts: dict[str, ToolContext]
) -> None:
    for name in ("b.txt", "a.py", ".env", ".git/config", "sub/data.csv", "sub/deep/far.txt"):
        await put(box, f"/testbed/std2/{name}", b"")
    out = await edit(contexts["standard"], command="view", path="/testbed/std2")
    assert out == (
        "Here's the files and directories up to 2 levels deep in /testbed/std2, excluding hidden:\n"
        "/testbed/std2\n/testbed/std2/a.py\n/testbed/std2/b.txt\n/testbed/std2/sub\n"
        "/testbed/std2/sub/data.csv\n/testbed/std2/sub/deep\n"
    )
    await put(box, "/testbed/.std2cache/x/y.txt", b"")
    inside_hidden = await edit(contexts["standard"], command="view", path="/testbed/.std2cache")
    assert inside_hidden.endswith(
        "\n/testbed/.std2cache\n/testbed/.std2cache/x\n/testbed/.std2cache/x/y.txt\n"
    )


async def test_standard_create_refuses_to_overwrite(
    box: DockerSandbox, contexts: dict[str, ToolContext]
) -> None:
    await put(box, "/testbed/std3/keep.txt", b"precious\n")
    out = await edit(
        contexts["standard"], command="create", path="/testbed/std3/keep.txt", file_text="x"
    )
    assert out.startswith("Error: File already exists at: /testbed/std3/keep.txt.")
    assert await read(box, "/testbed/std3/keep.txt") == b"precious\n"


async def test_standard_writes_exact_bytes_without_newline_growth_or_tab_expansion(
    box: DockerSandbox, contexts: dict[str, ToolContext]
) -> None:
    ctx, path = contexts["standard"], "/testbed/std4/code.py"
    created = await edit(ctx, command="create", path=path, file_text="if x:\n\ty = 1\n")
    assert created == (
        f"File created at {path}. Here's the result of running `cat -n` on {path}:\n"
        "     1\tif x:\n     2\t\ty = 1\n"
        "Review the file and make sure that it is as expected. Edit the file if necessary."
    )
    assert await read(box, path) == b"if x:\n\ty = 1\n"
    await edit(ctx, command="str_replace", path=path, old_str="\ty = 1", new_str="\ty = 2")
    assert await read(box, path) == b"if x:\n\ty = 2\n"
    await edit(ctx, command="insert", path=path, insert_line=2, new_str="\tz = 3")
    assert await read(box, path) == b"if x:\n\ty = 2\n\tz = 3\n"
    await edit(ctx, command="create", path="/testbed/std4/raw.txt", file_text="no newline")
    assert await read(box, "/testbed/std4/raw.txt") == b"no newline"


async def test_standard_paths_with_shell_characters_are_safe(
    box: DockerSandbox, contexts: dict[str, ToolContext]
) -> None:
    ctx = contexts["standard"]
    path = "/testbed/std5/it's a $HOME `touch /tmp/pwned1`;$(touch /tmp/pwned2).txt"
    created = await edit(ctx, command="create", path=path, file_text="one\n")
    assert created.startswith(f"File created at {path}. ")
    await edit(ctx, command="str_replace", path=path, old_str="one", new_str="two")
    assert (await edit(ctx, command="view", path=path)).endswith("     1\ttwo")
    assert await read(box, path) == b"two\n"
    gone = await box.exec(["sh", "-c", "ls /tmp/pwned1 /tmp/pwned2"])
    assert gone.exit_code != 0


async def test_standard_writes_large_files_through_stdin(
    box: DockerSandbox, contexts: dict[str, ToolContext]
) -> None:
    text = "".join(f"line {i} {'y' * 40}\n" for i in range(30000))  # ~1.5 MB, > ARG_MAX
    path = "/testbed/std6/big.txt"
    out = await edit(contexts["standard"], command="create", path=path, file_text=text)
    assert out.endswith(
        "</NOTE>\nReview the file and make sure that it is as expected. Edit the file if necessary."
    )
    await edit(
        contexts["standard"],
        command="str_replace",
        path=path,
        old_str="line 29999 ",
        new_str="last ",
    )
    assert await read(box, path) == text.replace("line 29999 ", "last ").encode()


async def test_standard_snippets_keep_a_blank_last_context_line(
    box: DockerSandbox, contexts: dict[str, ToolContext]
) -> None:
    # A blank line of the file at the end of the snippet is shown; only the file's final
    # newline adds no numbered line (golden step 14 shows the same for str_replace).
    await put(box, "/testbed/std9/blank.py", b"l1\nl2\n\n\nl5\n")
    out = await edit(
        contexts["standard"],
        command="insert",
        path="/testbed/std9/blank.py",
        insert_line=0,
        new_str="top",
    )
    assert out == (
        "The file /testbed/std9/blank.py has been edited. Here's the result of running `cat -n` "
        "on a snippet of the edited file:\n     1\ttop\n     2\tl1\n     3\tl2\n     4\t\n"
        "     5\t\nReview the changes and make sure they are as expected (correct indentation, "
        "no duplicate lines, etc). Edit the file again if necessary."
    )
    out = await edit(
        contexts["standard"],
        command="str_replace",
        path="/testbed/std9/blank.py",
        old_str="top\n",
        new_str="",
    )
    assert out == (
        "The file /testbed/std9/blank.py has been edited. Here's the result of running `cat -n` "
        "on a snippet of /testbed/std9/blank.py:\n     1\tl1\n     2\tl2\n     3\t\n     4\t\n"
        "     5\tl5\nReview the changes and make sure they are as expected. Edit the file again "
        "if necessary."
    )
    assert await read(box, "/testbed/std9/blank.py") == b"l1\nl2\n\n\nl5\n"


async def test_standard_refuses_files_too_large_to_edit(
    box: DockerSandbox, contexts: dict[str, ToolContext]
) -> None:
    await box.exec(["truncate", "-s", str(MAX_EDIT_BYTES + 1), "/testbed/huge.txt"])
    out = await edit(contexts["standard"], command="view", path="/testbed/huge.txt")
    assert out.startswith("Error: /testbed/huge.txt is too large for str_replace_editor")


async def test_standard_undo_edit_restores_previous_contents(
    box: DockerSandbox, contexts: dict[str, ToolContext]
) -> None:
    ctx, path = contexts["standard"], "/testbed/std7/u.txt"
    await put(box, path, b"v1\n")
    await edit(ctx, command="str_replace", path=path, old_str="v1", new_str="v2")
    await edit(ctx, command="insert", path=path, insert_line=0, new_str="top")
    assert await read(box, path) == b"top\nv2\n"
    undone = await edit(ctx, command="undo_edit", path=path)
    assert undone == (
        f"Last edit to {path} undone successfully. "
        f"Here's the result of running `cat -n` on {path}:\n     1\tv2\n"
    )
    assert await read(box, path) == b"v2\n"
    await edit(ctx, command="undo_edit", path=path)
    assert await read(box, path) == b"v1\n"
    assert await edit(ctx, command="undo_edit", path=path) == (
        f"Error: No edit history found for {path}."
    )


async def test_standard_refuses_binary_and_reports_missing_files(
    box: DockerSandbox, contexts: dict[str, ToolContext]
) -> None:
    ctx = contexts["standard"]
    await put(box, "/testbed/std8/blob.bin", b"\x00\x01\x02")
    binary = await edit(ctx, command="view", path="/testbed/std8/blob.bin")
    assert binary.startswith("Error: /testbed/std8/blob.bin looks like a binary file")
    missing = await edit(ctx, command="str_replace", path="/testbed/std8/none.txt", old_str="a")
    assert missing == "Error: Path not found: /testbed/std8/none.txt"
    assert await edit(ctx, command="bogus", path="/testbed") == "Unknown command: bogus"


async def test_edit_history_is_bounded_and_forgets_the_oldest_first() -> None:
    history = EditHistory(depth=2, max_chars=10)
    for version in ("a1", "a2", "a3"):
        history.push("/a", version)
    assert history.pop("/a") == "a3"
    history.push("/a", "a3")
    history.push("/b", "b" * 7)  # 11 chars in all: the oldest of the larger history goes
    assert history.pop("/b") is None
    assert [history.pop("/a"), history.pop("/a"), history.pop("/a")] == ["a3", "a2", None]
