"""`sandhive run`'s terminal output and run folders (no Docker needed for these)."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from app.agent.types import Action, Outcome, Step
from app.episode import EpisodeResult
from app.ids import utc_now
from app.local import TerminalSink, write_outputs
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

    from app.cli import cli

    args = ["run", "--prompt", "p", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
    done = CliRunner().invoke(cli, [*args, "--tools-profile", "reference", "--shell", "persistent"])
    assert done.exit_code == 2
    assert "persistent with the standard profile" in done.output
    odd = CliRunner().invoke(cli, [*args, "--shell", "sticky"])
    assert odd.exit_code == 2
