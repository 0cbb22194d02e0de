"""Every tool sub-command through the HTTP API, in real processes, with exact observations.

A scripted model drives `sandhive serve` + `sandhive worker`: execute_bash,
str_replace_editor view (file and directory), create, str_replace, insert,
undo_edit, and submit. The expected texts follow the package's layout
(REFERENCE.md §1.4 and shared/golden: markers, `Exit code:` line, `cat -n`
numbering, the editor's messages), not this code's output. A second task uses
the `reference` profile with the `long_context` prompt config: its input lands
in /testbed/documents and its answer is /testbed/answer.txt. A third keeps one
shell for the task (`"tools": {"shell": "persistent"}`).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.support.processes import Service, running_service

BASH = "Exit code: {code}\nExecution output of \\[execute_bash]:\n\\[STDOUT]\n{out}"
EDITOR = "Execution output of \\[str_replace_editor]:\n"
SCRIPT = "/testbed/output/script.py"
CAT_N = "Here's the result of running `cat -n` on {}:\n"
REVIEW_CREATE = "Review the file and make sure that it is as expected. Edit the file if necessary."
REVIEW_EDIT = (
    "Review the changes and make sure they are as expected. Edit the file again if necessary."
)
REVIEW_INSERT = (
    "Review the changes and make sure they are as expected (correct indentation, "
    "no duplicate lines, etc). Edit the file again if necessary."
)
LISTING = "Here's the files and directories up to 2 levels deep in {}, excluding hidden:\n"
ARTIFACT_CAP = 4096


def editor(command: str, **arguments: Any) -> Turn:
    return Turn(tool="str_replace_editor", arguments={"command": command, **arguments})


def bash(command: str) -> Turn:
    return Turn(tool="execute_bash", arguments={"command": command})


TOOL_TURNS = [
    bash("cat /testbed/input/data/notes.txt; echo oops >&2; exit 3"),
    editor("create", path=SCRIPT, file_text="print('a')\nprint('b')\n"),
    editor("view", path=SCRIPT),
    editor("str_replace", path=SCRIPT, old_str="print('a')", new_str="print('A')"),
    editor("insert", path=SCRIPT, insert_line=2, new_str="print('c')"),
    editor("view", path="/testbed/output"),
    editor("undo_edit", path=SCRIPT),
    bash(f"python3 {SCRIPT} && head -c 10000 /dev/zero > /testbed/output/big.bin"),
    editor("create", path="/testbed/output/answer.txt", file_text="42"),
    Turn(tool="submit", content="Done."),
]

EXPECTED = [
    BASH.format(code="Error: Exit code 3", out="hello\n\n\\[STDERR]\noops\n"),
    EDITOR
    + f"File created at {SCRIPT}. "
    + CAT_N.format(SCRIPT)
    + "     1\tprint('a')\n     2\tprint('b')\n"
    + REVIEW_CREATE,
    EDITOR + CAT_N.format(SCRIPT) + "     1\tprint('a')\n     2\tprint('b')",
    EDITOR
    + f"The file {SCRIPT} has been edited. "
    + CAT_N.format(f"a snippet of {SCRIPT}")
    + "     1\tprint('A')\n     2\tprint('b')\n"
    + REVIEW_EDIT,
    EDITOR
    + f"The file {SCRIPT} has been edited. "
    + CAT_N.format("a snippet of the edited file")
    + "     1\tprint('A')\n     2\tprint('b')\n     3\tprint('c')\n"
    + REVIEW_INSERT,
    EDITOR + LISTING.format("/testbed/output") + f"/testbed/output\n{SCRIPT}\n",
    EDITOR
    + f"Last edit to {SCRIPT} undone successfully. "
    + CAT_N.format(SCRIPT)
    + "     1\tprint('A')\n     2\tprint('b')\n",
    BASH.format(code="0", out="A\nb\n"),
    EDITOR
    + "File created at /testbed/output/answer.txt. "
    + CAT_N.format("/testbed/output/answer.txt")
    + "     1\t42\n"
    + REVIEW_CREATE,
    "<<< Finished >>>",
]


@pytest.fixture
def service(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    capped = settings.model_copy(update={"artifact_max_file_bytes": ARTIFACT_CAP})
    with running_service(capped, tmp_path) as svc:
        yield svc


def wait_finished(client: httpx.Client, task_id: str, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    task: dict[str, Any] = {}
    while time.monotonic() < deadline:
        task = client.get(f"/v1/tasks/{task_id}").json()
        if task["status"] not in ("queued", "running"):
            return task
        time.sleep(0.3)
    raise AssertionError(f"task {task_id} did not finish in {timeout_s} s: {task}")


def submit(client: httpx.Client, **body: Any) -> str:
    response = client.post("/v1/tasks", json={"prompt": "use every tool", **body})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_every_tool_sub_command_through_the_api(
    service: Service, scripted_llm: ScriptedLLMServer
) -> None:
    scripted_llm.add_script("e2e-tools", Script(TOOL_TURNS))
    scripted_llm.add_script(
        "e2e-long-context",
        Script(
            [
                Turn(
                    tool="execute_bash",
                    arguments={"command": "cat /testbed/documents/doc.txt > /testbed/answer.txt"},
                    expect="/testbed/documents",  # the prompt names the config's input dir
                ),
                editor("view", path="/testbed/answer.txt"),
                Turn(tool="submit"),
            ]
        ),
    )
    scripted_llm.add_script(
        "e2e-persistent",
        Script(
            [
                bash("cd /testbed/output && export V=7 && greet() { echo hi; }"),
                bash('pwd; echo "$V"; greet'),
                Turn(tool="submit"),
            ]
        ),
    )
    with httpx.Client(base_url=service.base_url, timeout=10) as client:
        persistent_id = submit(
            client, llm={"model": "e2e-persistent"}, tools={"shell": "persistent"}
        )
        tools_id = submit(
            client,
            llm={"model": "e2e-tools"},
            input_files=[{"path": "data/notes.txt", "content_base64": b64(b"hello\n")}],
        )
        context_id = submit(
            client,
            llm={"model": "e2e-long-context"},
            tools={"profile": "reference"},
            prompt_config="long_context",
            input_files=[{"path": "doc.txt", "content_base64": b64(b"The answer is 7.\n")}],
        )
        task = wait_finished(client, tools_id)
        context = wait_finished(client, context_id)
        trajectory = client.get(f"/v1/tasks/{tools_id}/trajectory").json()
        reference = client.get(f"/v1/tasks/{tools_id}/trajectory?format=reference").json()
        artifacts = client.get(f"/v1/tasks/{tools_id}/artifacts").json()
        script = client.get(f"/v1/tasks/{tools_id}/artifacts/script.py")
        context_steps = client.get(f"/v1/tasks/{context_id}/trajectory").json()["steps"]
        persistent = wait_finished(client, persistent_id)
        persistent_steps = client.get(f"/v1/tasks/{persistent_id}/trajectory").json()["steps"]

    assert (task["status"], task["finish_reason"]) == ("succeeded", "submitted"), service.logs()
    observations = [step["observation"] for step in trajectory["steps"]]
    for index, (seen, expected) in enumerate(zip(observations, EXPECTED, strict=True)):
        assert seen == expected, f"step {index}"
    assert [s["exit_code"] for s in trajectory["steps"]][:1] == [3]
    assert task["answer"] == "42"
    assert [item["path"] for item in task["artifacts_skipped"]] == ["big.bin"]
    assert task["artifacts_skipped"][0]["reason"]  # the collector's words, e.g. "too large"
    assert artifacts["skipped"] == task["artifacts_skipped"]
    assert {a["path"] for a in artifacts["items"]} == {"answer.txt", "script.py"}
    assert script.content == b"print('A')\nprint('b')\n"  # the insert was undone

    assert reference["problem_statement"] == "use every tool"
    assert reference["metadata"] == {"total_steps": len(TOOL_TURNS)}
    assert [s["action"]["function"] for s in reference["steps"]] == [t.tool for t in TOOL_TURNS]
    assert reference["steps"][3]["action"]["parameters"]["new_str"] == "print('A')"
    assert [s["observation"] for s in reference["steps"]] == EXPECTED

    assert (context["status"], context["answer"]) == ("succeeded", "The answer is 7.\n"), (
        service.logs()
    )
    assert context["prompt_config"] == "long_context"
    assert context_steps[1]["observation"] == (
        EDITOR + "ERROR: Viewing non-Python files is disallowed for saving context. "
        "File '/testbed/answer.txt' is not a .py or .rst file."
    )
    # "tools": {"shell": "persistent"}: cd, exports and functions carried over between steps.
    assert persistent["tools"]["shell"] == "persistent"
    assert persistent["status"] == "succeeded", service.logs()
    assert [s["observation"] for s in persistent_steps] == [
        BASH.format(code="0", out=""),
        BASH.format(code="0", out="/testbed/output\n7\nhi\n"),
        "<<< Finished >>>",
    ]
    assert [f for f in scripted_llm.failures if f.startswith("e2e-")] == []


def test_sandhive_run_with_an_anthropic_profile_and_a_package_prompt_file(
    scripted_llm: ScriptedLLMServer, docker_image: str, tmp_path: Path
) -> None:
    """`sandhive run --llm-profile --prompt-config FILE.yaml`: the package's own file format."""
    (tmp_path / "profiles.toml").write_text(
        f'[profiles.claude]\nkind = "anthropic"\nbase_url = "{scripted_llm.base_url}"\n'
        'model = "e2e-local-claude"\n'
    )
    (tmp_path / "answer_here.yaml").write_text(
        "system_prompt: 'Work in {working_dir}.'\n"
        "instance_prompt: 'Q: {problem_statement} Write {output_dir}/answer.txt'\n"
        "output_dir: /testbed\n"
    )
    scripted_llm.add_script(
        "e2e-local-claude",
        Script(
            [
                Turn(
                    tool="execute_bash",
                    arguments={"command": "echo 6 > /testbed/answer.txt"},
                    reasoning="Two times three.",
                    expect="Q: 2*3? Write /testbed/answer.txt",
                ),
                Turn(tool="submit", reasoning="Written."),
            ]
        ),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHIVE_")}
    env |= {
        "SANDHIVE_SANDBOX_IMAGE": docker_image,
        "SANDHIVE_LLM_PROFILES_FILE": str(tmp_path / "profiles.toml"),
    }
    out = tmp_path / "runs"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
            "run",
            "--prompt",
            "2*3?",
            "--llm-profile",
            "claude",
            "--prompt-config",
            str(tmp_path / "answer_here.yaml"),
            "--first-tool-call-only",
            "--output-dir",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [run_dir] = list(out.iterdir())
    assert (run_dir / "files" / "answer.txt").read_text() == "6\n"
    trajectory = json.loads((run_dir / "trajectory.json").read_text())
    assert [s["reasoning_content"] for s in trajectory["steps"]] == ["Two times three.", "Written."]
    assert [f for f in scripted_llm.failures if f.startswith("e2e-local")] == []
