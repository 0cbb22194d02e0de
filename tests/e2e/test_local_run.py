"""`sandhive run`: the same loop and sandbox in one process, no Postgres, no Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from app.llm.scripted import ScriptedLLMServer
from tests.e2e.test_task_end_to_end import EXPECTED, answer_script


def test_sandhive_run_writes_files_and_reference_trajectory(
    scripted_llm: ScriptedLLMServer, docker_image: str, tmp_path: Path
) -> None:
    scripted_llm.add_script("local-answer", answer_script())
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHIVE_")}
    # Point at nothing: the local run must not need Postgres or Redis.
    env |= {
        "SANDHIVE_SANDBOX_IMAGE": docker_image,
        "SANDHIVE_DATABASE_URL": "postgresql+asyncpg://nobody@127.0.0.1:1/none",
        "SANDHIVE_REDIS_URL": "redis://127.0.0.1:1/0",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
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
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "submitted" in done.stdout
    assert EXPECTED in done.stdout
    [run_dir] = list(tmp_path.iterdir())
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
    assert (run_dir / "files" / "answer.txt").read_text() == str(16796)  # the 10th Catalan number
