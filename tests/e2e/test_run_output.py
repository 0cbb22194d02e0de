"""What `sandhive run` prints: numbered steps, shell lines, diffs, live output, a summary.

Run as a user runs it (a subprocess, a real sandbox), against the built-in scripted
profile with no model server, no Postgres, no Redis and no way out to the network.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import typer

from app.cli.main import cli
from app.scripted.profile import TOUR_ANSWER, TOUR_IMAGE
from tests.e2e.test_local_run import local_sandboxes, printed_steps

DEAD = "http://127.0.0.1:1"
"""A proxy nobody listens on: any request that leaves the host fails."""


def offline_env(tmp_path: Path, columns: int) -> dict[str, str]:
    """No SANDHIVE_ settings but the image; Postgres, Redis and the internet unreachable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHIVE_")}
    env = {k: v for k, v in env.items() if k.lower() not in {"http_proxy", "https_proxy"}}
    env |= {
        "COLUMNS": str(columns),
        "PYTHONUNBUFFERED": "1",
        "SANDHIVE_DATABASE_URL": "postgresql+asyncpg://nobody@127.0.0.1:1/none",
        "SANDHIVE_REDIS_URL": "redis://127.0.0.1:1/0",
        "HTTP_PROXY": DEAD,
        "HTTPS_PROXY": DEAD,
        "ALL_PROXY": DEAD,
        "NO_PROXY": "127.0.0.1,localhost",  # the in-process scripted server, on loopback
        "HOME": str(tmp_path),  # no profiles file or settings of the developer's
    }
    return env


def run_timed(
    args: list[str], env: dict[str, str], stderr: Path
) -> tuple[list[tuple[float, str]], int]:
    """Each stdout line with when it arrived (seconds since the start), and the process's pid
    (its sandboxes carry it); fails on exit != 0."""
    started = time.monotonic()
    lines = []
    with (
        stderr.open("w") as err,
        subprocess.Popen(
            [sys.executable, "-m", "app", *args], env=env, stdout=subprocess.PIPE, stderr=err
        ) as proc,
    ):
        watchdog = threading.Timer(240, proc.kill)
        watchdog.start()
        try:
            assert proc.stdout is not None
            for raw in iter(proc.stdout.readline, b""):
                lines.append((time.monotonic() - started, raw.decode().rstrip("\n")))
            code = proc.wait()
        finally:
            watchdog.cancel()
    out = "\n".join(line for _, line in lines)
    assert code == 0, out + stderr.read_text()
    return lines, proc.pid


def test_a_scripted_run_prints_numbered_steps_commands_diffs_live_output_and_a_summary(
    docker_image: str, tmp_path: Path
) -> None:
    env = offline_env(tmp_path, columns=100) | {"SANDHIVE_SANDBOX_IMAGE": docker_image}
    args = ["run", "--scripted", "--model", "tour", "--prompt", "Collatz, please."]
    timed, pid = run_timed([*args, "--output-dir", str(tmp_path / "runs")], env, tmp_path / "err")
    stdout = "\n".join(line for _, line in timed)

    steps = dict(printed_steps(stdout))
    assert list(steps) == list(range(1, 10)), stdout  # the tour's nine steps, from 1
    # A command as its shell line; its output behind a gutter, its exit status after it.
    assert "$ ls -la /testbed && python3 --version" in steps[1]
    assert re.search(r"^│ Python 3\.\d+", steps[1], re.MULTILINE), steps[1]
    assert "NameError: name 'cuont' is not defined" in steps[3]
    assert "exit 1 · " in steps[3]
    # An edit as a unified diff of old_str → new_str; a created file as its head.
    assert "str_replace /testbed/collatz.py" in steps[4]
    diff = [line for line in steps[4].splitlines() if line[:1] in "+-@"]
    assert diff == [
        "--- a/testbed/collatz.py",
        "+++ b/testbed/collatz.py",
        "@@ -1 +1 @@",
        "-    return cuont",
        "+    return count",
    ], steps[4]
    assert "create /testbed/collatz.py" in steps[2]
    assert "+LIMIT = 10_000" in steps[2]
    assert re.search(r"^@@ new file, 26 lines @@$", steps[2], re.MULTILINE), steps[2]
    assert "… 14 more lines" in steps[2]  # the head, not the whole file
    assert '"file_text"' not in stdout  # no JSON dumps of the arguments
    # Timing and tokens on every step.
    for number, chunk in steps.items():
        assert re.search(r"model \d+(\.\d)? (ms|s)", chunk), (number, chunk)
        assert re.search(r"tokens [1-9][\d,]* in / [1-9][\d,]* out", chunk), (number, chunk)
        assert re.search(r"tool \d+(\.\d)? (ms|s)", chunk), (number, chunk)
    # Live output: the rerun's progress lines arrive as it prints them (a second apart in
    # the sandbox), before its step ends, not all at once when it does.
    arrived = {line: at for at, line in timed}
    first = arrived["│ checked  2000 starts; longest so far 1161 (181 steps)"]
    last = arrived["│ checked  8000 starts; longest so far 6171 (261 steps)"]
    footer = next(at for at, line in timed if at > last and line.startswith("exit 0 · "))
    assert last - first >= 2.0, (first, last)
    assert footer >= last
    # The closing panel: answer, finish reason, time and tokens.
    summary = stdout.split("╭─ finished ", 1)[1]
    assert f"answer: {TOUR_ANSWER}" in summary
    assert "finish_reason: submitted (9 steps)" in summary
    assert re.search(r"time: \d+(\.\d)? s \(model \d+(\.\d)? s, tools \d+(\.\d)? s\)", summary)
    assert re.search(r"tokens: [1-9][\d,]* \([\d,]+ in / [\d,]+ out\)", summary)
    [run_dir] = list((tmp_path / "runs").iterdir())
    assert f"outputs: {run_dir}" in stdout
    assert (run_dir / "files" / "answer.txt").read_text() == TOUR_ANSWER
    assert (run_dir / "files" / TOUR_IMAGE).read_bytes()[:4] == b"\x89PNG"
    assert local_sandboxes(pid) == set()  # its sandbox is gone


def test_run_help_reads_at_80_columns(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app", "run", "--help"],
        env=offline_env(tmp_path, columns=80),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, done.stdout
    assert "…" not in done.stdout, "nothing cut short"
    command = typer.main.get_command(cli)
    assert isinstance(command, typer.core.TyperGroup)
    params = command.commands["run"].params
    names = [name for param in params if not getattr(param, "hidden", False) for name in param.opts]
    assert len(names) > 15
    for name in names:  # every shown option's full name, on a line of its own
        assert any(line.strip("│ *").startswith(name + " ") for line in lines), name
    for panel in ("Model", "Limits", "Agent", "Files"):
        assert f"╭─ {panel} ─" in done.stdout
    assert "--llm_name" not in done.stdout  # the package's names: documented, not shown


def test_an_unknown_scripted_model_is_refused_before_any_sandbox(tmp_path: Path) -> None:
    env = offline_env(tmp_path, columns=100) | {"SANDHIVE_SANDBOX_IMAGE": "no-such:image"}
    base = [sys.executable, "-m", "app", "run", "--prompt", "p", "--scripted"]
    unknown = subprocess.run(
        [*base, "--model", "nope"], env=env, capture_output=True, text=True, timeout=60
    )
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr
    assert "model 'nope' is not allowed by llm profile 'scripted'" in unknown.stderr
    both = subprocess.run(
        [*base, "--llm-profile", "other"], env=env, capture_output=True, text=True, timeout=60
    )
    assert both.returncode == 2
    assert "leave out --llm-profile" in both.stderr
