"""A tenant's own images (`/v1/images/builds`), built by a real worker's Docker daemon from a
Dockerfile and a context, and the sandboxes started from them."""

from __future__ import annotations

import asyncio
import base64
import io
import subprocess
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.app import create_app
from app.config import Settings
from tests.api.conftest import serve
from tests.sandboxes.conftest import ALICE, BOB, run
from tests.support.processes import free_port, ready_worker
from tests.support.zygote import AppProcess

DOCKERFILE = """\
FROM default
ARG GREETING=hello
ENV GREETING_FILE=/opt/greeting/message.txt
RUN mkdir -p /opt/greeting \\
    && echo "$GREETING from the build" > "$GREETING_FILE" \\
    # the build's RUN has no network: only the loopback interface
    && ls /sys/class/net > /opt/greeting/interfaces
WORKDIR /srv/app
COPY notes.txt data/ ./
"""


@pytest.fixture
def sandbox_settings(make_sandbox_settings: Callable[..., Settings]) -> Settings:
    return make_sandbox_settings(image_builds=True, image_build_timeout_s=60)


def context(files: dict[str, str]) -> str:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(raw.getvalue()).decode()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def build(
    api: httpx.AsyncClient, headers: dict[str, str] = ALICE, **body: Any
) -> httpx.Response:
    return await api.post("/v1/images/builds", json=body, headers=headers)


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=False)


def docker_has(reference: str) -> bool:
    return docker("image", "inspect", reference).returncode == 0


async def test_a_dockerfile_builds_into_an_image_that_sandboxes_start_from(
    worker: AppProcess, api: httpx.AsyncClient
) -> None:
    name = unique("hello")
    files = {"notes.txt": "copied from the context\n", "data/more.txt": "more\n"}
    made = await build(
        api,
        name=name,
        dockerfile=DOCKERFILE,
        context=context(files),
        build_args={"GREETING": "hi"},
        description="the greeting task",
    )
    assert made.status_code == 201, made.text
    image = made.json()
    assert image["status"] == "ready"
    assert image["error"] is None
    assert image["image"] == f"built/{name}"
    assert image["base"] == "default"
    assert image["workdir"] == "/srv/app"
    assert image["env"]["GREETING_FILE"] == "/opt/greeting/message.txt"
    assert "Step 4/" in image["log"], image["log"]  # Docker's own build output
    assert image["reference"] == f"sandhive-built:{image['digest']}"
    assert docker_has(image["reference"])

    again = await build(
        api, name=name, dockerfile=DOCKERFILE, context=context(files), build_args={"GREETING": "hi"}
    )
    assert again.status_code == 200, again.text  # the same content: not built twice
    assert (again.json()["digest"], again.json()["built_at"]) == (
        image["digest"],
        image["built_at"],
    )

    listed = (await api.get("/v1/images", headers=ALICE)).json()["images"]
    assert f"built/{name}" in [entry["name"] for entry in listed]
    assert [
        i["name"] for i in (await api.get("/v1/images/builds", headers=ALICE)).json()["items"]
    ] == [name]

    box = await api.post("/v1/sandboxes", json={"image": f"built/{name}"}, headers=ALICE)
    assert box.status_code == 201, box.text
    assert box.json()["image"] == f"built/{name}"
    done = await run(
        api,
        box.json()["id"],
        command="cat /opt/greeting/message.txt notes.txt more.txt /opt/greeting/interfaces",
        cwd="/srv/app",
    )
    assert done["exit_code"] == 0, done
    assert done["stdout"] == "hi from the build\ncopied from the context\nmore\nlo\n"

    # Another tenant sees none of it.
    assert (await api.get(f"/v1/images/builds/{name}", headers=BOB)).status_code == 404
    refused = await api.post("/v1/sandboxes", json={"image": f"built/{name}"}, headers=BOB)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["details"][0]["type"] == "unknown_image"
    assert refused.json()["error"]["details"][0]["available"] == ["default"]
    bobs = (await api.get("/v1/images", headers=BOB)).json()["images"]
    assert not [entry for entry in bobs if entry["name"].startswith("built/")]

    # Deleted: no new sandbox of it.
    assert (await api.delete(f"/v1/images/builds/{name}", headers=ALICE)).status_code == 204
    gone = await api.post("/v1/sandboxes", json={"image": f"built/{name}"}, headers=ALICE)
    assert gone.status_code == 422, gone.text


async def test_a_worker_lacking_the_image_builds_it_again_when_a_sandbox_of_it_starts(
    worker: AppProcess, api: httpx.AsyncClient
) -> None:
    name = unique("again")
    dockerfile = f"FROM sandhive-sandbox:latest\nRUN echo {name} > /opt/made-here\n"
    made = await build(api, name=name, dockerfile=dockerfile)
    assert made.status_code == 201, made.text
    reference = made.json()["reference"]
    assert docker("rmi", "-f", reference).returncode == 0
    assert not docker_has(reference)

    box = await api.post("/v1/sandboxes", json={"image": f"built/{name}"}, headers=ALICE)
    assert box.status_code == 201, box.text
    done = await run(api, box.json()["id"], argv=["cat", "/opt/made-here"])
    assert done["stdout"] == f"{name}\n"
    assert docker_has(reference)


@pytest.mark.parametrize(
    ("body", "loc", "says"),
    [
        (
            {"dockerfile": "FROM python:3.12-slim\nRUN true\n"},
            "dockerfile",
            "line 1: FROM python:3.12-slim: not an image of this Sandhive's catalogue",
        ),
        (
            {"dockerfile": "FROM default\nADD https://example.com/x.tgz /x\n"},
            "dockerfile",
            "line 2: ADD: use COPY",
        ),
        (
            {"dockerfile": "FROM default AS one\nFROM default\nCOPY --from=alpine:3 /a /a\n"},
            "dockerfile",
            "line 3: COPY --from=alpine:3: only an earlier stage",
        ),
        ({"dockerfile": "FROM default\n", "context": "bm90IGEgdGFy"}, "context", "not a tar"),
    ],
    ids=["from-a-registry", "add-a-url", "copy-from-an-image", "context-not-a-tar"],
)
async def test_a_dockerfile_that_would_reach_outside_is_refused_and_nothing_stored(
    api: httpx.AsyncClient, body: dict[str, Any], loc: str, says: str
) -> None:
    # No worker: refused before one is looked for.
    refused = await build(api, name=unique("bad"), **body)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["details"][0]["loc"] == ["body", loc]
    assert says in error["message"], error["message"]
    assert (await api.get("/v1/images/builds", headers=ALICE)).json()["items"] == []


async def test_a_failing_step_fails_the_build_with_its_output(
    worker: AppProcess, api: httpx.AsyncClient
) -> None:
    name = unique("fails")
    dockerfile = "FROM default\nRUN echo building; echo no compiler >&2; exit 3\n"
    failed = await build(api, name=name, dockerfile=dockerfile)
    assert failed.status_code == 422, failed.text
    error = failed.json()["error"]
    assert error["code"] == "build_failed"
    assert "returned a non-zero code: 3" in error["message"], error["message"]
    assert "building" in error["details"]["log"]
    assert "no compiler" in error["details"]["log"]
    stored = (await api.get(f"/v1/images/builds/{name}", headers=ALICE)).json()
    assert stored["status"] == "failed"
    assert "non-zero code: 3" in stored["error"]
    box = await api.post("/v1/sandboxes", json={"image": f"built/{name}"}, headers=ALICE)
    assert box.status_code == 422, box.text  # a failed image starts nothing


async def test_a_build_that_never_ends_is_stopped_at_its_timeout(
    make_sandbox_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    port = free_port()
    settings = make_sandbox_settings(
        image_builds=True, image_build_timeout_s=3, worker_metrics_port=port
    )
    marker = uuid.uuid4().hex
    with ready_worker(settings, tmp_path / "worker.log"):
        async with serve(create_app(settings)) as api:
            api.timeout = httpx.Timeout(60)
            dockerfile = f"FROM default\nRUN sleep 600 # {marker}\n"
            failed = await build(api, name=unique("endless"), dockerfile=dockerfile)
            async with httpx.AsyncClient() as plain:
                metrics = (await plain.get(f"http://127.0.0.1:{port}/metrics")).text
    assert 'sandhive_worker_image_build_seconds_count{outcome="failed"} 1.0' in metrics
    assert failed.status_code == 422, failed.text
    assert "longer than 3 s" in failed.json()["error"]["message"]
    steps = ""
    for _ in range(50):  # the daemon removes the step's container once the worker left
        steps = docker("ps", "-a", "--no-trunc", "--format", "{{.Command}}").stdout
        if marker not in steps:
            break
        await asyncio.sleep(0.2)
    else:
        pytest.fail(f"the build step's container is still there:\n{steps}")


async def test_builds_are_refused_where_the_operator_has_not_allowed_them(
    make_sandbox_settings: Callable[..., Settings],
) -> None:
    async with serve(create_app(make_sandbox_settings())) as api:
        refused = await build(api, name="nope", dockerfile="FROM default\n")
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "image_builds_disabled"


async def test_a_multi_stage_build_copies_from_its_earlier_stage(
    worker: AppProcess, api: httpx.AsyncClient
) -> None:
    name = unique("stages")
    dockerfile = (
        "FROM default AS tools\n"
        "RUN echo made in a stage > /made\n"
        "FROM ${BASE_IMAGE}\n"
        "COPY --from=tools /made /opt/made\n"
    )
    made = await build(api, name=name, dockerfile=dockerfile)
    assert made.status_code == 201, made.text
    assert "FROM sandhive-sandbox:latest AS tools" in made.json()["log"]  # the canonical text
    box = await api.post("/v1/sandboxes", json={"image": f"built/{name}"}, headers=ALICE)
    assert box.status_code == 201, box.text
    done = await run(api, box.json()["id"], argv=["cat", "/opt/made"])
    assert done["stdout"] == "made in a stage\n"
