"""`sandhive run`'s terminal output and run folders (no Docker needed for these)."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from app.agent.types import Action, Outcome, Step
from app.ids import utc_now
from app.runner.episode import EpisodeResult
from app.runner.local import write_outputs
from app.runner.run_display import Summary, TerminalSink, summary_panel
from app.sandbox.files import CollectedFile
from app.states import FinishReason


async def test_model_text_that_looks_like_markup_is_printed_verbatim() -> None:
    out = io.StringIO()
    sink = TerminalSink(Console(file=out, width=200, color_system=None))
    step = Step(
        index=0,
        started_at=utc_now(),
        thought="close [/] and [red]not red[/red]",
        action=Action("execute_bash", {"command": "echo arr[/2]"}),
        observation="[/]",
    )
    await sink.step_completed(step)
    text = out.getvalue()
    assert "close [/] and [red]not red[/red]" in text
    assert "arr[/2]" in text


def printer() -> tuple[TerminalSink, io.StringIO]:
    out = io.StringIO()
    return TerminalSink(Console(file=out, width=100, color_system=None)), out


async def test_streamed_text_and_output_are_printed_once_in_whole_lines() -> None:
    sink, out = printer()
    await sink.step_started(0)
    await sink.live("llm.delta", {"index": 0, "text": "Let me "})
    await sink.live("llm.delta", {"index": 0, "text": "look.\n"})
    await sink.live(
        "tool.started", {"index": 0, "tool": "execute_bash", "arguments": {"command": "ls"}}
    )
    await sink.live("tool.output", {"index": 0, "stream": "stdout", "chunk": "a.t"})
    await sink.live("tool.output", {"index": 0, "stream": "stderr", "chunk": "warn\n"})
    await sink.live("tool.output", {"index": 0, "stream": "stdout", "chunk": "xt\nb.txt\n"})
    step = Step(
        index=0,
        started_at=utc_now(),
        thought="Let me look.",
        action=Action("execute_bash", {"command": "ls"}),
        observation="Exit code: 0\nExecution output of \\[execute_bash]:\n\\[STDOUT]\na.txt\nb.txt",
        exit_code=0,
        llm_ms=1500,
        tool_ms=42,
        prompt_tokens=1234,
        completion_tokens=56,
    )
    await sink.step_completed(step, 1)
    lines = out.getvalue().splitlines()
    assert "Step 1" in lines[0]
    # Each thing once: the streamed thought, the shell line, the output in whole lines (the
    # torn `a.t` + `xt` joined, even with stderr's line between), then the footer.
    assert lines[1:6] == ["Let me look.", "$ ls", "│ warn", "│ a.txt", "│ b.txt"], lines
    assert lines.count("Let me look.") == 1
    assert not any("STDOUT" in line for line in lines)
    assert "exit 0 · model 1.5 s · tool 42 ms · tokens 1,234 in / 56 out" in lines
    assert "Step 2" in lines[-1]


async def test_a_step_without_live_events_shows_its_action_and_observation() -> None:
    sink, out = printer()
    await sink.step_started(2)
    edit = {"command": "insert", "path": "/testbed/a.py", "insert_line": 3, "new_str": "x = 1"}
    step = Step(
        index=2,
        started_at=utc_now(),
        action=Action("str_replace_editor", edit),
        observation="Error: Invalid insert_line 3. Must be in [0, 1].",
        interrupted="timeout",
    )
    await sink.step_completed(step)
    text = out.getvalue()
    assert "Step 3" in text
    assert "insert /testbed/a.py\n@@ after line 3, 1 line @@\n+x = 1\n" in text
    assert "Error: Invalid insert_line 3. Must be in [0, 1]." in text  # errors in full
    assert "interrupted: timeout · model 0 ms · tool 0 ms · tokens 0 in / 0 out" in text


def test_the_summary_shows_answer_finish_time_and_tokens() -> None:
    outcome = Outcome(finish_reason=FinishReason.timeout, error="the task took more than 5 s")
    outcome.usage.prompt_tokens, outcome.usage.completion_tokens = 1000, 20
    outcome.usage.llm_seconds = 2.5
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(
        summary_panel(Summary(outcome, "line one\nline two\n", 75.0))
    )
    text = out.getvalue()
    assert text.startswith("╭─ finished ")
    assert "│ answer:" in text
    assert "│ line one" in text
    assert "│ line two" in text
    assert "finish_reason: timeout (0 steps)" in text
    assert "error: the task took more than 5 s" in text
    assert "time: 1 min 15 s (model 2.5 s)" in text
    assert "tokens: 1,020 (1,000 in / 20 out)" in text


def test_two_runs_in_the_same_second_get_their_own_folders(tmp_path: Path) -> None:
    def result(content: bytes) -> EpisodeResult:
        return EpisodeResult(
            outcome=Outcome(finish_reason=FinishReason.submitted),
            files=[CollectedFile(path="answer.txt", content=content)],
        )

    first = write_outputs(tmp_path, "p", result(b"1"))
    second = write_outputs(tmp_path, "p", result(b"2"))
    assert first != second
    assert (first / "files" / "answer.txt").read_bytes() == b"1"
    assert (second / "files" / "answer.txt").read_bytes() == b"2"


def test_output_paths_cannot_escape_the_files_folder(tmp_path: Path) -> None:
    hostile = EpisodeResult(
        outcome=Outcome(finish_reason=FinishReason.submitted),
        files=[
            CollectedFile(path="../../escape.txt", content=b"x"),
            CollectedFile(path="ok/a.txt", content=b"a"),
        ],
    )
    folder = write_outputs(tmp_path / "runs", "p", hostile)
    assert not (tmp_path / "escape.txt").exists()
    assert not (tmp_path / "runs" / "escape.txt").exists()
    assert (folder / "files" / "ok" / "a.txt").read_bytes() == b"a"


def test_run_refuses_a_persistent_shell_with_the_reference_profile() -> None:
    from typer.testing import CliRunner

    from app.cli.main import cli

    args = ["run", "--prompt", "p", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
    done = CliRunner().invoke(cli, [*args, "--tools-profile", "reference", "--shell", "persistent"])
    assert done.exit_code == 2
    assert "persistent with the standard profile" in done.output
    odd = CliRunner().invoke(cli, [*args, "--shell", "sticky"])
    assert odd.exit_code == 2
