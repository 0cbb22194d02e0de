"""Harbor task folders as an experiment dataset: `sandhive experiment run FOLDER` on a live
service (`sandhive serve` + `sandhive worker` subprocesses, image builds on), with the
scripted model in both arms.

Two small Harbor tasks, written here in Harbor's layout, each `FROM default` (the local
sandbox base): `answer-42` asks for a number in the answer file, `make-file` for a file
in /tmp. Each verifier (`tests/test.sh`) also requires a file its image's build made, so a
reward of 1 shows the item's sandbox ran the built image. The sandbox agent does both
tasks' work; the vanilla model answers 42, so in its fresh sandbox only `answer-42`
passes: sandbox 1, 1 and vanilla 1, 0.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.config import Settings
from app.scripted import ScriptedLLMServer
from app.scripted.script import Script, Turn
from tests.support.processes import Service, run_app, running_service, settings_env

AGENT, REPLY = "harbor-agent", "harbor-vanilla"
TASK_TOML = """\
version = "1.0"

[metadata]
difficulty = "easy"

[verifier]
timeout_sec = 60.0

[verifier.env]
EXPECTED = "{expected}"

[agent]
timeout_sec = 120.0

[environment]
build_timeout_sec = 300.0
"""
DOCKERFILE = """\
FROM default
RUN mkdir -p /opt/task && echo built > /opt/task/marker
"""
TESTS = {
    "answer-42": 'test "$(cat /testbed/output/answer.txt)" = "$EXPECTED"',
    "make-file": 'test "$(cat /tmp/made.txt)" = "$EXPECTED"',
}
INSTRUCTIONS = {
    "answer-42": "What is 6 * 7? Write only the number to /testbed/output/answer.txt.",
    "make-file": "Create /tmp/made.txt containing the word made.",
}
EXPECTED = {"answer-42": "42", "make-file": "made"}


def write_tasks(root: Path) -> Path:
    dataset = root / "harbor-tasks"
    for name, check in TESTS.items():
        task = dataset / name
        (task / "environment").mkdir(parents=True)
        (task / "tests").mkdir()
        (task / "solution").mkdir()
        (task / "task.toml").write_text(TASK_TOML.format(expected=EXPECTED[name]))
        (task / "instruction.md").write_text(INSTRUCTIONS[name] + "\n")
        (task / "environment" / "Dockerfile").write_text(DOCKERFILE)
        (task / "solution" / "solve.sh").write_text("echo never read\n")
        (task / "tests" / "test.sh").write_text(
            "#!/bin/bash\n"
            "if test -f /opt/task/marker && . /tests/lib/check.sh; then\n"
            "  echo 1 > /logs/verifier/reward.txt\nelse\n  echo 0 > /logs/verifier/reward.txt\nfi\n"
        )
        (task / "tests" / "lib").mkdir()
        (task / "tests" / "lib" / "check.sh").write_text(check + "\n")
    return dataset


@pytest.fixture
def service(
    settings: Settings, scripted_llm: ScriptedLLMServer, tmp_path: Path
) -> Iterator[Service]:
    work = "echo 42 > /testbed/output/answer.txt && echo made > /tmp/made.txt"
    scripted_llm.add_script(
        AGENT,
        Script([Turn(tool="execute_bash", arguments={"command": work}), Turn(tool="submit")]),
    )
    scripted_llm.add_script(REPLY, Script([Turn(content="42")], tools="none"))
    logs = tmp_path / "logs"
    logs.mkdir()
    with running_service(settings.model_copy(update={"image_builds": True}), logs) as svc:
        yield svc


def sandhive(settings: Settings, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**settings_env(settings), "COLUMNS": "200"}
    return run_app(*args, env=env, cwd=cwd, timeout=600)


def test_harbor_task_folders_run_as_an_experiment_scored_by_their_verifiers(
    service: Service, settings: Settings, scripted_llm: ScriptedLLMServer, tmp_path: Path
) -> None:
    dataset = write_tasks(tmp_path)
    run = ("experiment", "run", dataset, "--server", service.base_url, "--mode", "both")
    models = ("--model", AGENT, "--vanilla-model", REPLY)
    done = sandhive(settings, *run, *models, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr + service.logs()
    out = json.loads(done.stdout)
    assert out["experiment"]["scorer"] == {"kind": "verifier"}
    means = {arm["arm"]: arm["mean"] for arm in out["results"]["arms"]}
    assert means == {"sandbox": 1.0, "vanilla": 0.5}
    (pair,) = out["results"]["pairs"]
    assert (pair["n"], pair["wins"], pair["ties"], pair["losses"]) == (2, 1, 1, 0)

    exp_id = out["experiment"]["id"]
    with httpx.Client(base_url=service.base_url) as api:
        items = api.get(f"/v1/experiments/{exp_id}/items").json()["items"]
        scores = {(i["row_id"], i["arm"]): i["score"] for i in items}
        assert scores == {
            ("answer-42", "sandbox"): 1.0,
            ("make-file", "sandbox"): 1.0,
            ("answer-42", "vanilla"): 1.0,
            ("make-file", "vanilla"): 0.0,
        }
        detail = next(i["detail"] for i in items if i["row_id"] == "make-file")
        assert (detail["exit_code"], detail["infrastructure"]) == (0, False)
        task = api.get(f"/v1/tasks/{items[0]['task_id']}").json()
        assert task["sandbox"]["image_name"] == "default", "it waits on its base's queue"
        assert task["prompt"].strip() == INSTRUCTIONS[items[0]["row_id"]]
        # Both tasks have the same environment: one image, named by its content.
        (build,) = api.get("/v1/images/builds").json()["items"]
        assert build["name"].startswith("harbor-")
        assert {
            api.get(f"/v1/tasks/{i['task_id']}").json()["sandbox"]["built"]["name"] for i in items
        } == {build["name"]}

    # Run again: the images are built already (same folders), and nothing is sent twice.
    again = sandhive(settings, *run, *models, "--mode", "sandbox", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr + service.logs()
    assert "building" not in again.stderr, again.stderr
    assert "1.000" in again.stdout

    # A folder without a verifier is refused before anything is built or run.
    (dataset / "make-file" / "tests" / "test.sh").unlink()
    broken = sandhive(settings, *run, *models, cwd=tmp_path)
    assert broken.returncode == 2
    assert "no tests/test.sh (the verifier)" in broken.stderr, broken.stderr
