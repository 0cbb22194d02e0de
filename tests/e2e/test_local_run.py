"""`sandhive run`: the same loop and sandbox in one process, no Postgres, no Redis."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from app.scripted import ScriptedLLMServer
from tests.e2e.test_task_end_to_end import EXPECTED, SQUARES, answer_script

RUN_FOLDER = re.compile(r"^\d{8}_\d{6}$")
"""`<YYYYMMDD_HHMMSS>`, as the reference package names its run folders (app/runner/local.py)."""


def local_sandboxes(pid: int) -> set[str]:
    """Ids of the containers the `sandhive run` of process `pid` labelled as its own
    (app/runner/local.py), stopped ones too."""
    out = subprocess.run(
        [
            *("docker", "ps", "-aq", "--no-trunc"),
            *("--filter", "label=sandhive.local=1", "--filter", f"label=sandhive.local.pid={pid}"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


def run_sandhive(
    args: list[str], env: dict[str, str], *, timeout: float
) -> tuple[subprocess.CompletedProcess[str], int]:
    """`python -m app ARGS` run to its end, and its pid (which its sandboxes carry)."""
    with subprocess.Popen(
        [sys.executable, "-m", "app", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid


def printed_steps(stdout: str) -> list[tuple[int, str]]:
    """(number, what was printed for it) per step, as the terminal printer shows them: a
    `Step N` rule, then the step's text, action and result (app/runner/run_display.py), up to the
    closing `finished` panel."""
    body = re.split(r"╭─ finished ", stdout, maxsplit=1)[0]
    rules = list(re.finditer(r"─ Step (\d+) ─", body))
    return [
        (int(rule.group(1)), body[rule.end() : following.start() if following else len(body)])
        for rule, following in zip(rules, [*rules[1:], None], strict=True)
    ]


def test_sandhive_run_writes_files_and_reference_trajectory(
    scripted_llm: ScriptedLLMServer, docker_image: str, tmp_path: Path
) -> None:
    scripted_llm.add_script("local-answer", answer_script())
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHIVE_")}
    # Point at nothing: the local run must not need Postgres or Redis.
    env |= {
        "COLUMNS": "120",  # Rich's width when stdout is no terminal: titles stay on one line
        "SANDHIVE_SANDBOX_IMAGE": docker_image,
        "SANDHIVE_DATABASE_URL": "postgresql+asyncpg://nobody@127.0.0.1:1/none",
        "SANDHIVE_REDIS_URL": "redis://127.0.0.1:1/0",
    }
    done, pid = run_sandhive(
        [
            "run",
            "--prompt",
            "sum of squares",
            "--base-url",
            scripted_llm.base_url,
            "--model",
            "local-answer",
            "--output-dir",
            str(tmp_path),
        ],
        env,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Each step is printed as it happens, numbered from 1 as in the page, with its action and
    # its result (the answer shows in step 1's output, not only in the closing summary).
    steps = printed_steps(done.stdout)
    assert [number for number, _ in steps] == [1, 2, 3], done.stdout
    assert f'$ python3 -c "{SQUARES}"' in steps[0][1]
    assert f"│ {EXPECTED}" in steps[0][1]
    assert "create /testbed/output/answer.txt" in steps[1][1]
    assert f"+{EXPECTED}" in steps[1][1]
    assert "File created at /testbed/output/answer.txt" in steps[1][1]
    assert "<<< Finished >>>" in steps[2][1]
    assert "finish_reason: submitted (3 steps)" in done.stdout
    assert f"answer: {EXPECTED}" in done.stdout
    # Its sandbox is gone (the containers labelled with its process id: other runs' are not
    # ours to judge).
    assert local_sandboxes(pid) == set()
    [run_dir] = list(tmp_path.iterdir())
    assert RUN_FOLDER.match(run_dir.name), run_dir.name
    assert f"outputs: {run_dir}" in done.stdout
    assert (run_dir / "files" / "answer.txt").read_text() == EXPECTED
    trajectory = json.loads((run_dir / "trajectory.json").read_text())
    assert set(trajectory) == {"problem_statement", "steps", "metadata"}
    assert trajectory["problem_statement"] == "sum of squares"
    assert trajectory["metadata"] == {"total_steps": 3}
    first = trajectory["steps"][0]
    assert set(first) == {"thought", "reasoning_content", "action", "observation", "metadata"}
    assert first["action"]["function"] == "execute_bash"
    assert EXPECTED in first["observation"]
    assert set(first["metadata"]) == {"step", "exec_time"}
    assert trajectory["steps"][-1]["action"] == {"function": "submit", "parameters": {}}


def test_sandhive_demo_runs_the_scripted_task(docker_image: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHIVE_")}
    env["SANDHIVE_SANDBOX_IMAGE"] = docker_image
    done = subprocess.run(
        [sys.executable, "-m", "app", "demo", "--output-dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SCRIPTED DEMO" in done.stdout
    [run_dir] = list(tmp_path.iterdir())
    assert RUN_FOLDER.match(run_dir.name), run_dir.name
    assert (run_dir / "files" / "answer.txt").read_text() == str(16796)  # the 10th Catalan number
