"""`sandhive experiment`: a task folder in the package's format run on a live service
(`sandhive serve` + `sandhive worker` subprocesses) or `--local`, with the scripted model.

The folder (written here) has the package's layout: config.yaml with a local json dataset
and its prompts, reward.py, vanilla_llm_prompt.py. The sandbox script copies the row's
input file to the package's answer path (/testbed/answer.txt, the runner's fallback output
dir) and the vanilla script answers 42, so the scores are known: sandbox 1, 1, 0 and
vanilla 1, 0, 0 on the three rows.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from inspect_ai.log import read_eval_log

from app.config import Settings
from app.scripted import ScriptedLLMServer
from app.scripted.script import Script, Turn
from tests.support.processes import Service, run_app, running_service, settings_env

SANDBOX_MODEL, VANILLA_MODEL, SLOW_MODEL = "pkg-sandbox", "pkg-vanilla", "pkg-slow"
CONFIG = """\
dataset: json
data_files: data.json
system_prompt: |
  You work in {working_dir}. Documents are in {input_dir}.
instance_prompt: |
  <problem>{problem_statement}</problem>
  Write only the answer to {output_dir}/answer.txt.
working_dir: /ignored   # the package's runner ignores these; its fallbacks apply
"""
REWARD = """\
def compute_score(agent_answer, ground_truth, **row):
    assert row["domain"] == "arith", row
    return 1.0 if agent_answer.strip() == str(ground_truth) else 0.0
"""
VANILLA_PROMPT = """\
def create_prompt(row):
    return "Question " + str(row["id"]) + ": " + row["problem_statement"] + " Number only."
"""
ROWS = [
    {"id": "r1", "problem_statement": "Read n.txt.", "ground_truth": "42", "n": "42"},
    {"id": "r2", "problem_statement": "Read n.txt.", "ground_truth": "17", "n": "17"},
    {"id": "r3", "problem_statement": "Read n.txt.", "ground_truth": "5", "n": "6"},
]
SANDBOX_MEANS = {"sandbox": 2 / 3, "vanilla": 1 / 3}


def write_task(root: Path, *, reward: bool = True) -> Path:
    folder = root / "arith"
    folder.mkdir()
    (folder / "config.yaml").write_text(CONFIG)
    rows = [
        {
            "id": row["id"],
            "problem_statement": row["problem_statement"],
            "ground_truth": row["ground_truth"],
            "domain": "arith",
            # As the Hub stores it: a JSON string.
            "input_files": json.dumps({"n.txt": row["n"]}),
        }
        for row in ROWS
    ]
    (folder / "data.json").write_text(json.dumps(rows))
    if reward:
        (folder / "reward.py").write_text(REWARD)
    (folder / "vanilla_llm_prompt.py").write_text(VANILLA_PROMPT)
    return folder


@pytest.fixture
def scripts(scripted_llm: ScriptedLLMServer) -> ScriptedLLMServer:
    """The three models; each checks it got the folder's prompt (`expect`, else HTTP 409)."""
    copy = "cp /testbed/documents/n.txt /testbed/answer.txt && cat /testbed/answer.txt"
    scripted_llm.add_script(
        SANDBOX_MODEL,
        Script(
            [
                Turn(
                    tool="execute_bash",
                    arguments={"command": copy},
                    expect="Write only the answer to /testbed/answer.txt.",
                ),
                Turn(tool="submit"),
            ]
        ),
    )
    scripted_llm.add_script(
        VANILLA_MODEL, Script([Turn(content="42", expect=" Number only.")], tools="none")
    )
    scripted_llm.add_script(
        SLOW_MODEL, Script([Turn(tool="execute_bash", arguments={"command": "sleep 60"})])
    )
    return scripted_llm


@pytest.fixture
def service(settings: Settings, scripts: ScriptedLLMServer, tmp_path: Path) -> Iterator[Service]:
    logs = tmp_path / "logs"
    logs.mkdir()
    with running_service(settings, logs) as svc:
        yield svc


def sandhive(
    settings: Settings, *args: str | Path, cwd: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return run_app(
        *args, env={**settings_env(settings), "COLUMNS": "200"}, cwd=cwd, timeout=timeout
    )


MODELS = ("--model", SANDBOX_MODEL, "--vanilla-model", VANILLA_MODEL)


def check_results(results: dict[str, Any], attempts: int = 1) -> None:
    means = {arm["arm"]: arm["mean"] for arm in results["arms"]}
    assert means == pytest.approx(SANDBOX_MEANS)
    assert [arm["n"] for arm in results["arms"]] == [3 * attempts, 3 * attempts]
    (pair,) = results["pairs"]
    assert (pair["a"], pair["b"], pair["n"]) == ("sandbox", "vanilla", 3)
    assert pair["difference"] == pytest.approx(1 / 3)
    assert (pair["wins"], pair["ties"], pair["losses"]) == (1, 2, 0)
    assert (pair["p_value"], pair["verdict"]) == (1.0, "too_few_pairs")


def test_a_package_folder_runs_on_the_service_in_both_modes(
    service: Service, settings: Settings, scripts: ScriptedLLMServer, tmp_path: Path
) -> None:
    folder = write_task(tmp_path)
    server = ("--server", service.base_url)
    done = sandhive(
        settings, "experiment", "run", folder, "--mode", "both", *server, *MODELS, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr + service.logs()
    assert scripts.failures == [], scripts.failures
    (exp_id,) = re.findall(r"experiment (exp_\w+) on", done.stderr)
    table = done.stdout
    assert re.search(r"sandbox\s+│\s+3\s+│\s+3/3 scored\s+│\s+0\.667", table), table
    assert re.search(r"vanilla\s+│\s+3\s+│\s+3/3 scored\s+│\s+0\.333", table), table
    assert re.search(r"sandbox\s+│\s+vanilla\s+│\s+3\s+│.*\+0\.333.*1/2/0", table), table
    assert re.search(r"hoeffding\s+│\s+1/2/0\s+│\s+1\.000\s+│\s+too few pairs", table), table
    words = "too few rows with a winner (1; 8 needed) to tell sandbox and vanilla apart"
    assert f"sandbox - vanilla: {words}" in table, table

    results = sandhive(settings, "experiment", "results", exp_id, *server, "--json", cwd=tmp_path)
    assert results.returncode == 0, results.stderr
    check_results(json.loads(results.stdout))

    status = sandhive(settings, "experiment", "status", exp_id, *server, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert f"{exp_id} finished arith (both)" in status.stdout

    listed = sandhive(settings, "experiment", "items", exp_id, *server, "--json", cwd=tmp_path)
    items = json.loads(listed.stdout)["items"]
    scores = {(i["arm"], i["row_id"]): (i["status"], i["score"], i["answer"]) for i in items}
    assert scores == {
        ("sandbox", "r1"): ("scored", 1.0, "42"),
        ("sandbox", "r2"): ("scored", 1.0, "17"),
        ("sandbox", "r3"): ("scored", 0.0, "6"),
        ("vanilla", "r1"): ("scored", 1.0, "42"),
        ("vanilla", "r2"): ("scored", 0.0, "42"),
        ("vanilla", "r3"): ("scored", 0.0, "42"),
    }
    csv = sandhive(settings, "experiment", "items", exp_id, *server, "--csv", cwd=tmp_path)
    assert csv.stdout.splitlines()[0].startswith("row_id,arm,attempt,status,score")
    assert len(csv.stdout.splitlines()) == 7
    listing = sandhive(settings, "experiment", "items", exp_id, *server, cwd=tmp_path)
    assert listing.returncode == 0
    assert "r3" in listing.stdout

    check_exports(settings, exp_id, server, tmp_path)

    # The vanilla task got create_prompt's text alone: no documents embedded again.
    task_id = next(i["task_id"] for i in items if i["arm"] == "vanilla" and i["row_id"] == "r2")
    task = httpx.get(f"{service.base_url}/v1/tasks/{task_id}").json()
    assert task["prompt"] == "Question r2: Read n.txt. Number only."

    finished = sandhive(settings, "experiment", "cancel", exp_id, *server, cwd=tmp_path)
    assert finished.returncode == 1
    assert finished.stderr.startswith("error: 409"), finished.stderr


def check_exports(settings: Settings, exp_id: str, server: tuple[str, str], tmp: Path) -> None:
    """`sandhive experiment export` in its three formats: JSONL, ATIF, Inspect logs."""
    export = ("experiment", "export", exp_id, *server)
    lines = tmp / "rollouts.jsonl"
    done = sandhive(settings, *export, "--out", lines, cwd=tmp)
    assert done.returncode == 0, done.stderr
    assert len(lines.read_text().splitlines()) == 6

    done = sandhive(settings, *export, "--format", "atif", "--out", tmp / "atif", cwd=tmp)
    assert done.returncode == 0, done.stderr
    written = sorted(p.relative_to(tmp / "atif" / exp_id) for p in (tmp / "atif").rglob("*.json"))
    assert [str(p) for p in written] == [
        f"{arm}/{row}-1.json" for arm in ("sandbox", "vanilla") for row in ("r1", "r2", "r3")
    ]
    trajectory = json.loads((tmp / "atif" / exp_id / "vanilla" / "r2-1.json").read_text())
    assert trajectory["steps"][0] == {
        "step_id": 1,
        "source": "user",
        "message": "Question r2: Read n.txt. Number only.",
    }
    assert trajectory["extra"]["reward"] == 0.0

    done = sandhive(settings, *export, "--format", "inspect", "--out", tmp / "logs", cwd=tmp)
    assert done.returncode == 0, done.stderr
    assert f"inspect view --log-dir {tmp / 'logs'}" in done.stderr
    for arm, mean in SANDBOX_MEANS.items():
        log = read_eval_log(str(tmp / "logs" / f"{exp_id}-{arm}.eval"))
        assert log.results is not None
        assert log.results.scores[0].metrics["mean"].value == pytest.approx(mean)
        assert log.samples is not None
        assert sorted(str(s.id) for s in log.samples) == ["r1", "r2", "r3"]


def test_json_output_is_machine_readable(
    service: Service, settings: Settings, tmp_path: Path
) -> None:
    folder = write_task(tmp_path)
    run = ("experiment", "run", folder, "--server", service.base_url)
    done = sandhive(
        settings, *run, "--mode", "both", *MODELS, "--json", "--attempts", "2", cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr + service.logs()
    out = json.loads(done.stdout)
    assert out["experiment"]["status"] == "finished"
    assert out["experiment"]["attempts"] == 2
    results = out["results"]
    check_results(results, attempts=2)
    # Every attempt plays the same script: each row passes all its attempts or none.
    assert results["arms"][0]["pass_at_k"] == pytest.approx({"1": 2 / 3, "2": 2 / 3})

    exp_id, server = out["experiment"]["id"], ("--server", service.base_url)
    bad = sandhive(
        settings, "experiment", "regrade", exp_id, "--scorer", "vibes", *server, cwd=tmp_path
    )
    assert bad.returncode == 2
    assert "unknown scorer kind 'vibes'" in bad.stderr, bad.stderr
    regrade = sandhive(
        settings, "experiment", "regrade", exp_id, "--scorer", "exact", *server, cwd=tmp_path
    )
    assert regrade.returncode == 0, regrade.stderr
    assert regrade.stdout.strip() == f"regrading {exp_id} (grading 2)"
    status = sandhive(settings, "experiment", "status", exp_id, *server, "--json", cwd=tmp_path)
    assert json.loads(status.stdout)["grading"] == 2


AS_A_FOREGROUND_JOB = (
    "import runpy, signal, sys; "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv = ['app', *sys.argv[1:]]; "
    "runpy.run_module('app', run_name='__main__', alter_sys=True)"
)
"""`python -m app ARGS` with SIGINT as a terminal's foreground job has it: a child inherits
its parent's ignored and blocked signals, and once (2026-12-05) the command under test
polled on for 120 s after its SIGINT, which only an ignored or blocked SIGINT explains (the
command rightly keeps an ignored SIGINT ignored, as a background job's)."""


def test_ctrl_c_leaves_the_experiment_running_and_cancel_stops_it(
    service: Service, settings: Settings, tmp_path: Path
) -> None:
    folder = write_task(tmp_path)
    args = ["experiment", "run", str(folder), "--server", service.base_url, "--model", SLOW_MODEL]
    proc = subprocess.Popen(
        [sys.executable, "-c", AS_A_FOREGROUND_JOB, *args],
        env=settings_env(settings),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    seen = ""
    while (found := re.search(r"experiment (exp_\w+) on", seen)) is None:
        line = proc.stderr.readline()
        assert line, f"no experiment id: {seen}"
        seen += line
    exp_id = found.group(1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    # One Ctrl-C ends it at once when the machine is idle; a loaded 2-core CI machine gets
    # room, and a hang still fails (with what it printed) instead of passing.
    try:
        _, rest = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        signals = Path(f"/proc/{proc.pid}/status").read_text()
        seen += "".join(line for line in signals.splitlines(True) if line.startswith("Sig"))
        proc.kill()
        _, rest = proc.communicate()
        pytest.fail(f"still running 120 s after one SIGINT:\n{seen}{rest}")
    assert proc.returncode == 130, seen + rest
    assert f"experiment {exp_id} keeps running" in rest
    server = ("--server", service.base_url)
    status = sandhive(settings, "experiment", "status", exp_id, *server, "--json", cwd=tmp_path)
    assert json.loads(status.stdout)["status"] == "running"

    cancelled = sandhive(settings, "experiment", "cancel", exp_id, *server, cwd=tmp_path)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == f"cancelling {exp_id}"
    deadline = time.monotonic() + 60
    while True:
        status = sandhive(settings, "experiment", "status", exp_id, *server, "--json", cwd=tmp_path)
        state = json.loads(status.stdout)
        if state["progress"]["sandbox"]["running"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert state["status"] == "cancelled"
    assert state["progress"]["sandbox"]["cancelled"] == 3, state


def local_env(settings: Settings) -> dict[str, str]:
    """The test's model and image; Postgres and Redis point at nothing: --local needs neither."""
    return {
        **settings_env(settings),
        "COLUMNS": "200",
        "SANDHIVE_DATABASE_URL": "postgresql+asyncpg://nobody@127.0.0.1:1/none",
        "SANDHIVE_REDIS_URL": "redis://127.0.0.1:1/0",
    }


@pytest.mark.parametrize("scorer", ["exact", "reward.py"])
def test_local_runs_in_one_process_and_writes_the_packages_results(
    settings: Settings, scripts: ScriptedLLMServer, tmp_path: Path, scorer: str
) -> None:
    folder = write_task(tmp_path)
    choice = ["--scorer", scorer] if scorer != "reward.py" else []
    args = ["experiment", "run", folder, "--local", "--mode", "both", *MODELS, *choice]
    done = run_app(*args, "--output-dir", tmp_path / "out", env=local_env(settings), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert scripts.failures == [], scripts.failures
    assert re.search(r"sandbox\s+│\s+3\s+│\s+3/3 scored\s+│\s+0\.667", done.stdout), done.stdout
    (run,) = (tmp_path / "out").iterdir()
    assert re.fullmatch(r"\d{8}_\d{6}_arith", run.name)
    check_results(json.loads((run / "report.json").read_text()))
    items = json.loads((run / "items.json").read_text())["items"]
    assert sorted((i["arm"], i["row_id"], i["score"]) for i in items) == [
        ("sandbox", "r1", 1.0),
        ("sandbox", "r2", 1.0),
        ("sandbox", "r3", 0.0),
        ("vanilla", "r1", 1.0),
        ("vanilla", "r2", 0.0),
        ("vanilla", "r3", 0.0),
    ]
    package = json.loads((run / "sandbox" / "results.json").read_text())
    assert package["config"]["mode"] == "llm-in-sandbox"
    assert package["config"]["llm_name"] == SANDBOX_MODEL
    assert (package["task"], package["total"], package["num_errors"]) == ("arith", 3, 0)
    assert package["mean_score"] == pytest.approx(2 / 3)
    vanilla = json.loads((run / "vanilla" / "results.json").read_text())
    assert (vanilla["config"]["mode"], vanilla["mean_score"]) == ("llm", pytest.approx(1 / 3))
    trajectories = json.loads((run / "sandbox" / "trajectory.json").read_text())
    assert trajectories["r3"]["agent_answer"] == "6"
    assert trajectories["r3"]["reward"] == 0.0
    steps = trajectories["r1"]["trajectory"]
    assert [step["action"]["function"] for step in steps] == ["execute_bash", "submit"]


def test_a_bad_folder_is_exit_2_with_a_message(settings: Settings, tmp_path: Path) -> None:
    missing = sandhive(settings, "experiment", "run", tmp_path / "nope", cwd=tmp_path)
    assert missing.returncode == 2
    assert "is not a directory" in missing.stderr
    folder = write_task(tmp_path)
    (folder / "data.json").unlink()
    (folder / "config.yaml").write_text("dataset: some/hub-set\nsystem_prompt: s\n")
    hub = sandhive(settings, "experiment", "run", folder, cwd=tmp_path)
    assert hub.returncode == 2
    assert "cannot be downloaded here" in hub.stderr, hub.stderr
    (tmp_path / "good").mkdir()
    good = write_task(tmp_path / "good")
    unreachable = sandhive(
        settings, "experiment", "run", good, "--server", "http://127.0.0.1:9", cwd=tmp_path
    )
    assert unreachable.returncode == 1
    assert "cannot reach the service at http://127.0.0.1:9" in unreachable.stderr
    args = ["experiment", "run", good, "--local", "--max-steps", "100000000"]
    too_many = run_app(
        *args, "--output-dir", tmp_path / "out", env=local_env(settings), cwd=tmp_path, timeout=120
    )
    assert too_many.returncode == 2, too_many.stdout + too_many.stderr
    assert "error: arms.0.task.limits.max_steps" in too_many.stderr, too_many.stderr
    assert not (tmp_path / "out").exists()


def test_a_folder_the_service_refuses_is_exit_2_naming_the_field(
    service: Service, settings: Settings, tmp_path: Path
) -> None:
    folder = write_task(tmp_path)
    run = ("experiment", "run", folder, "--server", service.base_url)
    done = sandhive(settings, *run, "--max-steps", "100000000", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "error: 422: arms.0.task.limits.max_steps" in done.stderr
    listed = httpx.get(f"{service.base_url}/v1/experiments").json()
    assert listed["experiments"] == [], "nothing was created"

    submitted = sandhive(
        settings, *run, "--mode", "vanilla", "--model", VANILLA_MODEL, "--no-wait", cwd=tmp_path
    )
    assert submitted.returncode == 0, submitted.stderr
    exp_id = submitted.stdout.strip()
    assert re.fullmatch(r"exp_\w+", exp_id), submitted.stdout
    assert httpx.get(f"{service.base_url}/v1/experiments/{exp_id}").json()["rows"] == 3


def test_a_data_file_alone_runs_with_a_built_in_scorer(
    service: Service, settings: Settings, scripted_llm: ScriptedLLMServer, tmp_path: Path
) -> None:
    """No task folder: the rows of a JSON Lines file, the service's own prompts (input under
    /testbed/input, the answer in /testbed/output), `--arms` and `--scorer` on the line."""
    copy = "cp /testbed/input/n.txt /testbed/output/answer.txt"
    scripted_llm.add_script(
        "data-sandbox",
        Script([Turn(tool="execute_bash", arguments={"command": copy}), Turn(tool="submit")]),
    )
    scripted_llm.add_script("data-vanilla", Script([Turn(content="42")], tools="none"))
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "\n".join(json.dumps({**row, "input_files": {"n.txt": row["n"]}}) for row in ROWS) + "\n"
    )
    done = sandhive(
        settings,
        "experiment",
        "run",
        "--data",
        data,
        "--arms",
        "sandbox,vanilla",
        "--scorer",
        "exact",
        "--model",
        "data-sandbox",
        "--vanilla-model",
        "data-vanilla",
        "--server",
        service.base_url,
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr + service.logs()
    out = json.loads(done.stdout)
    assert (out["experiment"]["name"], out["experiment"]["rules"]) == ("rows (both)", "package")
    check_results(out["results"])
