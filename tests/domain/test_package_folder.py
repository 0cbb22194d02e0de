"""Task folders in the reference package's format (REFERENCE.md §1.9), written here under
tmp_path, read into an experiment body that the service's own checks accept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.domain.package_folder import (
    VANILLA_FIELD,
    FolderError,
    RunOptions,
    experiment_body,
    parse_arms,
    parse_mode,
    parse_scorer,
    read_folder,
    read_source,
)
from app.errors import InvalidInput
from app.schemas.experiments import ExperimentCreate
from app.services.experiments.input import check_experiment, item_prompt
from tests.support.settings import plain_settings

REWARD = """def compute_score(agent_answer, ground_truth, **row):
    return float(agent_answer.strip().lower() == str(ground_truth).strip().lower())
"""
SYSTEM = "You solve things in {working_dir}; files in {input_dir}; answer to {output_dir}."
INSTANCE = "<problem>{problem_statement}</problem> Write {output_dir}/answer.txt."
ROWS = [
    {"id": "q1", "problem_statement": "What is 6 * 7?", "ground_truth": "42", "domain": "arith"},
    {
        "id": "q2",
        "problem_statement": "Sum the numbers in n.txt.",
        "ground_truth": "6",
        "input_files": json.dumps({"n.txt": "1\n2\n3\n", "gap.txt": None}),
    },
    {"id": 3, "problem_statement": "Name the third planet.", "ground_truth": "earth"},
]


def write_folder(root: Path, *, config: dict[str, Any] | str | None = None, **files: str) -> Path:
    """A task folder: config.yaml (a local json dataset by default), reward.py, data.json."""
    folder = root / "demo"
    folder.mkdir(parents=True)
    if config is None:
        config = {
            "dataset": "json",
            "data_files": "data.json",
            "system_prompt": SYSTEM,
            "instance_prompt": INSTANCE,
            "working_dir": "/elsewhere",  # ignored by the package's runner: the fallbacks win
        }
    text = config if isinstance(config, str) else json.dumps(config)  # JSON is YAML
    (folder / "config.yaml").write_text(text)
    files = {"reward.py": REWARD, "data.json": json.dumps(ROWS), **files}
    for name, content in files.items():
        if content:
            (folder / name).write_text(content)
    return folder


def accepted(body: dict[str, Any]) -> Any:
    """The body as the service checks it (no I/O): InvalidInput when it would be a 422."""
    return check_experiment(ExperimentCreate.model_validate(body), plain_settings("unused"))


def test_a_json_dataset_with_its_prompts_and_reward_becomes_an_experiment(
    tmp_path: Path,
) -> None:
    folder = read_folder(write_folder(tmp_path))
    body = experiment_body(folder, RunOptions(attempts=2, concurrency=3, max_steps=7))
    assert [row["id"] for row in body["dataset"]["rows"]] == ["q1", "q2", 3]
    (arm,) = body["arms"]
    assert arm == {
        "name": "sandbox",
        "mode": "sandbox",
        "task": {
            "prompt_config": {
                "system": SYSTEM,
                "instance": INSTANCE,
                "working_dir": "/testbed",
                "input_dir": "/testbed/documents",
                "output_dir": "/testbed",
            },
            "limits": {"max_steps": 7},
        },
    }
    assert body["scorer"] == {"kind": "python", "code": REWARD}
    assert (body["attempts"], body["concurrency"], body["name"]) == (2, 3, "demo (sandbox)")
    assert body["rules"] == "package", "scored as the package scores"
    checked = accepted(body)
    assert checked.scorer == {"kind": "python", "code": REWARD}
    assert checked.rows[1]["input_files"] == {"n.txt": "1\n2\n3\n"}


def test_input_files_as_a_json_string_become_an_object_without_empty_entries(
    tmp_path: Path,
) -> None:
    folder = read_folder(write_folder(tmp_path))
    assert folder.rows[1]["input_files"] == {"n.txt": "1\n2\n3\n", "gap.txt": None}
    assert "input_files" not in folder.rows[0]
    body = experiment_body(folder, RunOptions())
    rows = [{**body["dataset"]["rows"][0], "input_files": None}, *body["dataset"]["rows"][1:]]
    checked = accepted({**body, "dataset": {"rows": rows}})
    assert [row["input_files"] for row in checked.rows] == [{}, {"n.txt": "1\n2\n3\n"}, {}], (
        "null (the field, or one file's content) is no file, as the package reads it"
    )


def test_data_files_resolve_against_the_packages_benchmark_dir_too(tmp_path: Path) -> None:
    """The package resolves data_files against benchmark/, the task folder's parent."""
    config = {"dataset": "json", "data_files": "demo/rows.jsonl", "system_prompt": SYSTEM}
    folder = write_folder(tmp_path, config=config, **{"data.json": ""})
    (folder / "rows.jsonl").write_text("\n".join(json.dumps(row) for row in ROWS[:2]) + "\n")
    read = read_folder(folder)
    assert [row["id"] for row in read.rows] == ["q1", "q2"]
    assert read.prompts.instance == ""


def test_a_local_data_json_stands_in_for_a_hub_dataset(tmp_path: Path) -> None:
    config = {
        "dataset": "daixuancheng/llm-in-sandbox-bench",
        "config": "demo",
        "system_prompt": "s",
    }
    folder = read_folder(write_folder(tmp_path, config=config))
    assert [row["id"] for row in folder.rows] == ["q1", "q2", 3]
    assert folder.data_source.endswith("data.json")


def test_a_hub_dataset_without_local_data_says_what_to_do(tmp_path: Path) -> None:
    config = {
        "dataset": "daixuancheng/llm-in-sandbox-bench",
        "config": "math",
        "system_prompt": "s",
    }
    path = write_folder(tmp_path, config=config, **{"data.json": ""})
    with pytest.raises(FolderError, match="cannot be downloaded here") as err:
        read_folder(path)
    assert "'daixuancheng/llm-in-sandbox-bench' (config 'math')" in str(err.value)
    assert "data.json" in str(err.value)
    assert "--data" in str(err.value)
    other = tmp_path / "rows.json"
    other.write_text(json.dumps({"rows": ROWS[:1]}))
    assert [row["id"] for row in read_folder(path, data=other).rows] == ["q1"]
    other.write_text(json.dumps(ROWS[2]) + "\n")  # JSON Lines of one row, as to_json writes
    assert [row["id"] for row in read_folder(path, data=other).rows] == [3]


def test_start_and_end_ids_are_the_packages_zero_based_half_open_range(tmp_path: Path) -> None:
    folder = read_folder(write_folder(tmp_path))
    ids = [
        [row["id"] for row in experiment_body(folder, options)["dataset"]["rows"]]
        for options in (
            RunOptions(start_id=1),
            RunOptions(end_id=2),
            RunOptions(start_id=1, end_id=2),
        )
    ]
    assert ids == [["q2", 3], ["q1", "q2"], ["q2"]]
    with pytest.raises(FolderError, match="no rows"):
        experiment_body(folder, RunOptions(start_id=3))


@pytest.mark.parametrize(
    ("config", "files", "message"),
    [
        (None, {"config.yaml": ""}, "has no config.yaml"),
        ("dataset: json\n", {}, "neither system_prompt nor prompt_config"),
        ("[unclosed", {}, "not valid YAML"),
        ({"dataset": "json", "system_prompt": "s"}, {}, "needs data_files"),
        ({"dataset": "json", "data_files": "nope.json", "system_prompt": "s"}, {}, "not found"),
        (
            {"dataset": "json", "data_files": "data.json", "system_prompt": "s"},
            {"data.json": json.dumps([{"id": "a", "problem_statement": "p"}])},
            "lacks ['ground_truth']",
        ),
        (
            {"dataset": "json", "data_files": "data.json", "system_prompt": "s"},
            {"data.json": "{not json\n"},
            "neither JSON nor JSON Lines",
        ),
    ],
)
def test_a_broken_folder_is_refused_naming_what_is_wrong(
    tmp_path: Path, config: Any, files: dict[str, str], message: str
) -> None:
    folder = write_folder(tmp_path, config=config or "x: 1", **files)
    if config is None:
        (folder / "config.yaml").unlink()
    with pytest.raises(FolderError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_folder(folder)


def test_no_folder_at_all_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FolderError, match="is not a directory"):
        read_folder(tmp_path / "missing")


def test_without_reward_py_a_built_in_scorer_is_needed(tmp_path: Path) -> None:
    folder = read_folder(write_folder(tmp_path, **{"reward.py": ""}))
    with pytest.raises(FolderError, match=r"has no reward\.py"):
        experiment_body(folder, RunOptions())
    body = experiment_body(folder, RunOptions(scorer=parse_scorer("exact")))
    assert body["scorer"] == {"kind": "exact"}
    assert accepted(body).scorer == {"kind": "exact"}
    assert parse_scorer('{"kind": "mcq", "choices": "ABCD"}') == {"kind": "mcq", "choices": "ABCD"}
    for kind in ("math", "mcq"):  # the package's reward rule for its domain
        body = experiment_body(folder, RunOptions(scorer=parse_scorer(kind)))
        assert accepted(body).scorer == {"kind": kind, "package": True}
    own = {"kind": "mcq", "choices": "ABCD"}
    assert experiment_body(folder, RunOptions(scorer=own))["scorer"] == own, "as written"
    with pytest.raises(FolderError, match="neither a scorer name nor JSON"):
        parse_scorer("{nope")


def test_a_separate_prompt_config_file_keeps_its_directories(tmp_path: Path) -> None:
    """The package's legacy format: the file is kept whole, so its dirs apply."""
    config = {"dataset": "json", "data_files": "data.json", "prompt_config": "prompts.yaml"}
    prompts = {
        "system_prompt": SYSTEM,
        "instance_prompt": INSTANCE,
        "input_dir": "/testbed/input",
        "output_dir": "/testbed/output",
    }
    folder = read_folder(
        write_folder(tmp_path, config=config, **{"prompts.yaml": json.dumps(prompts)})
    )
    option = experiment_body(folder, RunOptions())["arms"][0]["task"]["prompt_config"]
    assert (option["working_dir"], option["input_dir"], option["output_dir"]) == (
        "/testbed",
        "/testbed/input",
        "/testbed/output",
    )


VANILLA_PROMPT = """def create_prompt(row):
    return "Q[" + str(row["id"]) + "]: " + row["problem_statement"] + " Reply with the answer."
"""


def test_both_modes_with_the_folders_vanilla_prompt(tmp_path: Path) -> None:
    """create_prompt(row) is rendered here into each row; the vanilla arm sends it whole."""
    path = write_folder(tmp_path, **{"vanilla_llm_prompt.py": VANILLA_PROMPT})
    folder = read_folder(path)
    options = RunOptions(mode="both", model="m", vanilla_model="v", llm_profile="default")
    body = experiment_body(folder, options)
    sandbox, vanilla = body["arms"]
    assert (sandbox["name"], vanilla["name"]) == ("sandbox", "vanilla")
    assert sandbox["task"]["llm"] == {"profile": "default", "model": "m"}
    assert vanilla == {
        "name": "vanilla",
        "mode": "vanilla",
        "task": {"llm": {"profile": "default", "model": "v"}},
        "prompt_field": VANILLA_FIELD,
    }
    prompts = [row[VANILLA_FIELD] for row in body["dataset"]["rows"]]
    assert prompts[0] == "Q[q1]: What is 6 * 7? Reply with the answer."
    checked = accepted(body)
    stored_vanilla = checked.arms[1]
    assert item_prompt(stored_vanilla, checked.rows[1]) == (prompts[1], {})
    assert item_prompt(checked.arms[0], checked.rows[1]) == (
        "Sum the numbers in n.txt.",
        {"n.txt": "1\n2\n3\n"},
    )


def test_without_a_vanilla_prompt_file_the_vanilla_arm_takes_the_problem(tmp_path: Path) -> None:
    body = experiment_body(read_folder(write_folder(tmp_path)), RunOptions(mode="vanilla"))
    (arm,) = body["arms"]
    assert arm == {"name": "vanilla", "mode": "vanilla", "task": {}}
    assert all(VANILLA_FIELD not in row for row in body["dataset"]["rows"])
    accepted(body)


def test_a_failing_create_prompt_names_the_row(tmp_path: Path) -> None:
    broken = "def create_prompt(row):\n    return row['missing']\n"
    folder = read_folder(write_folder(tmp_path, **{"vanilla_llm_prompt.py": broken}))
    with pytest.raises(FolderError, match=r"create_prompt failed on row 'q1' \(KeyError"):
        experiment_body(folder, RunOptions(mode="vanilla"))
    assert (
        read_folder(
            write_folder(tmp_path / "b", **{"vanilla_llm_prompt.py": broken}), vanilla=False
        ).create_prompt
        is None
    )


def test_the_service_refuses_a_row_without_the_arms_prompt_field(tmp_path: Path) -> None:
    path = write_folder(tmp_path, **{"vanilla_llm_prompt.py": VANILLA_PROMPT})
    body = experiment_body(read_folder(path), RunOptions(mode="both"))
    del body["dataset"]["rows"][2][VANILLA_FIELD]
    with pytest.raises(InvalidInput) as err:
        accepted(body)
    details = err.value.details
    assert isinstance(details, list)
    (found,) = details
    assert found["loc"] == ["body", "dataset", "rows", 2, VANILLA_FIELD]
    assert "row 3" in found["msg"]


def test_the_packages_mode_names_are_understood() -> None:
    assert [parse_mode(m) for m in ("llm-in-sandbox", "llm", "both")] == [
        "sandbox",
        "vanilla",
        "both",
    ]
    with pytest.raises(FolderError, match="sandbox, vanilla or both"):
        parse_mode("fast")


def test_a_data_file_alone_names_the_file_and_line_of_a_bad_row(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    good = {"id": "a", "problem_statement": "p", "ground_truth": "1"}
    data.write_text(json.dumps(good) + "\n\n" + '{"id": "b", "problem_statement": "p"}\n')
    with pytest.raises(FolderError, match=r"rows\.jsonl:3 \('b'\) lacks \['ground_truth'\]"):
        read_source(None, data, vanilla=False)
    data.write_text(json.dumps(good) + "\n{oops\n")
    with pytest.raises(FolderError, match=r"rows\.jsonl:2: neither JSON nor JSON Lines"):
        read_source(None, data, vanilla=False)
    data.write_text(json.dumps(good) + "\n[1, 2]\n")
    with pytest.raises(FolderError, match=r"rows\.jsonl:2: a row must be a JSON object"):
        read_source(None, data, vanilla=False)
    with pytest.raises(FolderError, match="give a task folder, or a data file"):
        read_source(None, None, vanilla=False)


def test_a_data_file_alone_runs_on_the_services_prompts_with_a_built_in_scorer(
    tmp_path: Path,
) -> None:
    data = tmp_path / "rows.json"
    data.write_text(json.dumps([{"id": 1, "problem_statement": "p", "ground_truth": "2"}]))
    folder = read_source(None, data, vanilla=True)
    with pytest.raises(FolderError, match=r"rows\.json: rows without a task folder need --scorer"):
        experiment_body(folder, RunOptions())
    options = RunOptions(mode=parse_arms("vanilla, sandbox"), scorer={"kind": "math"}, max_steps=4)
    body = experiment_body(folder, options)
    assert [arm["task"] for arm in body["arms"]] == [{"limits": {"max_steps": 4}}, {}], (
        "no prompt_config: the service's own prompts; the steps limit on the sandbox arm"
    )
    assert accepted(body).scorer == {"kind": "math", "package": True}
    assert (parse_arms("sandbox"), parse_arms("vanilla")) == ("sandbox", "vanilla")
    with pytest.raises(FolderError, match="--arms must name"):
        parse_arms("sandbox,judge")
