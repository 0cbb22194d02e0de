"""A client generated from our OpenAPI document by a generator nobody here wrote
(openapi-python-client, pinned in the dev extra) imports in every module, and its
functions drive a live API: a task, an experiment from JSON, the upload operation.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.api.app import create_app
from app.config import Settings
from tests.support.processes import Service, running_service

PACKAGE = "sandhive_generated"
CHECK = """
import importlib, json, pkgutil, sys
sys.path.insert(0, sys.argv[1])
package = importlib.import_module(sys.argv[2])
failed = {}
for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    try:
        importlib.import_module(module.name)
    except Exception as error:
        failed[module.name] = repr(error)
print(json.dumps(failed))
"""
DRIVE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from sandhive_generated import Client
from sandhive_generated.api.tasks import create_task_v1_tasks_post, get_task_v1_tasks_task_id_get
from sandhive_generated.api.experiments import (
    create_experiment_v1_experiments_post as create_experiment,
    upload_experiment_v1_experiments_upload_post as upload_experiment,
)
from sandhive_generated.models import ExperimentCreate, TaskCreate
from sandhive_generated.models.upload_experiment_v1_experiments_upload_post_body import (
    UploadExperimentV1ExperimentsUploadPostBody as UploadBody,
)
from sandhive_generated.types import File

client = Client(base_url=sys.argv[2])
task = create_task_v1_tasks_post.sync(client=client, body=TaskCreate.from_dict({"prompt": "hi"}))
again = get_task_v1_tasks_task_id_get.sync(client=client, task_id=task.id)
spec = {"name": "gen", "arms": [{"name": "a"}], "scorer": {"kind": "exact"}}
rows = [{"id": "q1", "problem_statement": "2+2?", "ground_truth": "4"}]
made = create_experiment.sync(
    client=client, body=ExperimentCreate.from_dict({**spec, "dataset": {"rows": rows}})
)
dataset = File(payload=open(sys.argv[3], "rb"), file_name="rows.jsonl")
body = UploadBody(spec=json.dumps(spec), dataset=dataset)
uploaded = upload_experiment.sync(client=client, body=body)
print(json.dumps([task.id, again.id, made.id, uploaded.id, uploaded.rows]))
"""


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The client, generated into a temporary folder from this release's document (the
    default settings with `make run`'s scripted profile: the document lists a server's
    profiles, and a task may then leave `llm` out; it does not depend on a database)."""
    folder = tmp_path_factory.mktemp("generated")
    document = folder / "openapi.json"
    document.write_text(json.dumps(create_app(Settings(scripted_profile=True)).openapi()))
    generator = Path(sys.executable).parent / "openapi-python-client"
    assert generator.exists(), "install the dev extra: pip install -e '.[dev]'"
    done = subprocess.run(
        [
            *(str(generator), "generate", "--path", str(document), "--meta", "none"),
            *("--output-path", str(folder / PACKAGE)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"PATH": f"{generator.parent}:/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout, done.stdout  # nothing of the document was skipped
    return folder


def test_every_generated_module_imports(generated: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(generated), PACKAGE],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert json.loads(done.stdout) == {}
    assert len(list((generated / PACKAGE / "api").rglob("*.py"))) > 40


@pytest.fixture
def service(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    with running_service(settings, tmp_path) as svc:
        yield svc


def test_the_generated_functions_drive_a_live_api(
    generated: Path, service: Service, tmp_path: Path
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"id": "q1", "problem_statement": "2+2?", "ground_truth": "4"}))
    done = subprocess.run(
        [sys.executable, "-c", DRIVE, str(generated), service.base_url, str(rows)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    task_id, read_id, experiment_id, uploaded_id, uploaded_rows = json.loads(done.stdout)
    assert task_id.startswith("tsk_")
    assert read_id == task_id
    assert experiment_id.startswith("exp_")
    assert uploaded_id.startswith("exp_")
    assert uploaded_rows == 1
