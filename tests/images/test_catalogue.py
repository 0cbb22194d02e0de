"""The image catalogue file and what submissions may ask of it: names, tenants, maxima (422s).

No Docker here: the catalogue is read and checked where a submission is resolved, in the
API process, which never talks to Docker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.config import Settings
from app.domain.image_catalogue import CatalogueError, catalogue, for_tenant
from app.domain.resolve import resolve_spec
from app.errors import InvalidInput
from app.schemas.episodes import EpisodeCreate
from app.schemas.experiments import ExperimentCreate
from app.schemas.tasks import SandboxRequest, TaskCreate
from app.services.episodes import service as episodes
from app.services.experiments.input import check_experiment
from app.specs import read_spec, stored

CATALOGUE = """
[images.chem]
reference = "example/chem:1"
description = "RDKit and friends"
tenants = ["team-a"]
warm_pool_size = 2
pids_limit = 256
[images.chem.defaults]
cpus = 2.0
memory_mb = 2048
[images.chem.max]
cpus = 3.0
memory_mb = 3072
disk_mb = 2048

[images.java]
dockerfile = "java.Dockerfile"
description = "A JDK"
"""


INVERTED = "[images.x]\nreference = 'x'\n[images.x.defaults]\ncpus = 3.5\n[images.x.max]\ncpus = 3"


def base(**overrides: Any) -> Settings:
    """A server with a model profile nobody calls (submissions resolve) and these settings."""
    model = {"llm_base_url": "http://127.0.0.1:9/v1", "llm_model": "m"}
    return Settings(_env_file=None, **{**model, **overrides})


def with_catalogue(tmp_path: Path, text: str = CATALOGUE) -> Settings:
    path = tmp_path / "images.toml"
    path.write_text(text)
    return base(sandbox_images_file=path, max_cpus=4, max_memory_mb=4096)


def problems_of(exc: pytest.ExceptionInfo[InvalidInput]) -> list[dict[str, Any]]:
    details = exc.value.details
    assert isinstance(details, list)
    return details


def test_without_a_file_there_is_only_default_as_it_always_was() -> None:
    settings = base(sandbox_image="sandhive-sandbox:x", warm_pool_size=1)
    images = catalogue(settings)
    assert list(images) == ["default"]
    default = images["default"]
    assert default.reference == "sandhive-sandbox:x"
    assert (default.default_cpus, default.max_cpus) == (settings.default_cpus, settings.max_cpus)
    assert (default.pids_limit, default.warm_pool_size) == (settings.sandbox_pids_limit, 1)
    spec = resolve_spec(TaskCreate(prompt="p"), settings)
    assert (spec.sandbox.image, spec.sandbox.image_name) == ("sandhive-sandbox:x", "default")
    assert "image_name" not in stored(spec)["sandbox"], "rows of default look like older ones"
    assert read_spec(stored(spec)).sandbox.image_name == "default"


def test_a_file_adds_images_with_its_values_and_the_servers_elsewhere(tmp_path: Path) -> None:
    settings = with_catalogue(tmp_path)
    images = catalogue(settings)
    assert sorted(images) == ["chem", "default", "java"]
    chem, java = images["chem"], images["java"]
    assert (chem.reference, chem.description, chem.tenants) == (
        "example/chem:1",
        "RDKit and friends",
        frozenset({"team-a"}),
    )
    assert (chem.default_cpus, chem.max_cpus, chem.default_memory_mb) == (2.0, 3.0, 2048)
    assert (chem.default_disk_mb, chem.max_disk_mb) == (settings.default_disk_mb, 2048)
    assert (chem.pids_limit, chem.warm_pool_size) == (256, 2)
    assert java.reference == "sandhive-image-java:latest"
    assert java.dockerfile == tmp_path / "java.Dockerfile", "relative to the file"
    assert java.tenants is None
    assert [i.name for i in for_tenant(settings, "team-b")] == ["default", "java"]
    assert [i.name for i in for_tenant(settings, "team-a")] == ["chem", "default", "java"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[images."Bad Name"]\nreference = "x"', "bad name"),
        ('[images.x]\ndescription = "neither"', "needs reference or dockerfile"),
        ('[images.default]\nreference = "other"', "SANDHIVE_SANDBOX_IMAGE"),
        ("[images.x]\nreference = 'x'\n[images.x.max]\ncpus = 64", "above SANDHIVE_MAX_CPUS"),
        (INVERTED, "default cpus"),
        ("[images.x]\nreference = 'x'\ncolour = 'red'", "colour"),
        ("[images.x\n", "image catalogue"),
    ],
)
def test_a_wrong_file_is_refused_saying_what_is_wrong(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(CatalogueError, match=says):
        catalogue(with_catalogue(tmp_path, text))


def test_unknown_and_forbidden_images_get_the_same_422_listing_the_allowed(
    tmp_path: Path,
) -> None:
    settings = with_catalogue(tmp_path)
    for name in ("nope", "chem"):
        body = TaskCreate(prompt="p", sandbox=SandboxRequest(image=name))
        with pytest.raises(InvalidInput) as exc:
            resolve_spec(body, settings, tenant="team-b")
        (problem,) = problems_of(exc)
        assert problem["loc"] == ["body", "sandbox", "image"]
        assert problem["available"] == ["default", "java"]
        assert problem["msg"] == f"image {name!r} is not available; available: default, java"
    spec = resolve_spec(
        TaskCreate(prompt="p", sandbox=SandboxRequest(image="chem")), settings, tenant="team-a"
    )
    assert (spec.sandbox.image, spec.sandbox.image_name) == ("example/chem:1", "chem")
    assert (spec.sandbox.cpus, spec.sandbox.memory_mb) == (2.0, 2048), "the image's defaults"


def test_resources_beyond_the_images_maximum_are_refused(tmp_path: Path) -> None:
    settings = with_catalogue(tmp_path)
    asked = SandboxRequest(image="chem", cpus=3.5, memory_mb=4096, disk_mb=2048)
    with pytest.raises(InvalidInput) as exc:
        resolve_spec(TaskCreate(prompt="p", sandbox=asked), settings, tenant="team-a")
    found = {tuple(p["loc"][2:]): p["limit"] for p in problems_of(exc)}
    assert found == {("cpus",): 3.0, ("memory_mb",): 3072}, "within the server's, not the image's"
    default = SandboxRequest(cpus=3.5, memory_mb=4096)
    assert resolve_spec(TaskCreate(prompt="p", sandbox=default), settings).sandbox.cpus == 3.5


def test_experiment_arms_and_episodes_are_checked_the_same_way(tmp_path: Path) -> None:
    settings = with_catalogue(tmp_path)
    body = ExperimentCreate.model_validate(
        {
            "name": "e",
            "dataset": {"rows": [{"id": "r", "problem_statement": "p", "ground_truth": "1"}]},
            "arms": [{"name": "a", "task": {"sandbox": {"image": "chem"}}}],
            "scorer": {"kind": "exact"},
        }
    )
    with pytest.raises(InvalidInput) as exc:
        check_experiment(body, settings, "team-b")
    assert [p["loc"] for p in problems_of(exc)] == [["body", "arms", 0, "task", "sandbox", "image"]]
    assert check_experiment(body, settings, "team-a").arms[0]["name"] == "a"
    episode = EpisodeCreate(prompt="p", sandbox=SandboxRequest(image="chem"))
    with pytest.raises(InvalidInput, match="available: default, java"):
        episodes.new_row(settings, "team-b", episode)
    row = episodes.new_row(settings, "team-a", episode)
    assert row.spec["task"]["sandbox"]["image_name"] == "chem"
