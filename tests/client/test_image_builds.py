"""The client's image builds (sync and async) against a real Sandhive: a Dockerfile and a
context directory built by a real worker's Docker, then a sandbox started from the image.

`sandhive serve` and a `sandhive worker` run as subprocesses with API keys and image builds
on; what the client returns is checked against what a sandbox of the image shows (the files
the context sent, a symlink still a link, the image's WORKDIR and ENV).
"""

from __future__ import annotations

import io
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandhive_client import (
    AsyncSandhive,
    Forbidden,
    Image,
    ImageBuild,
    ImageBuildFailed,
    InvalidInput,
    NotFound,
    Sandhive,
    harbor_build,
)
from sandhive_client._build import pack_directory

from app.config import Settings
from app.db.engine import Sessions
from app.services import keys
from tests.e2e.fault_harness import Cluster, cluster

DOCKERFILE = """\
FROM default
ARG GREETING=hello
ENV GREETING_FILE=/opt/greeting/message.txt
RUN mkdir -p /opt/greeting && echo "$GREETING from the build" > "$GREETING_FILE"
WORKDIR /srv/app
COPY . .
"""


@pytest.fixture(autouse=True)
def _no_sandbox_left(no_sandbox_left: None) -> None:
    """A test's sandboxes go with it."""


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """API keys and image builds on; a build may take a minute."""
    return settings.model_copy(
        update={"auth": "keys", "image_builds": True, "image_build_timeout_s": 60.0}
    )


@pytest.fixture
async def key(sessions: Sessions) -> str:
    return (await keys.create_key(sessions, "tenant-builds", "harness")).key


@pytest.fixture
def client(live: Cluster, key: str) -> Iterator[Sandhive]:
    """A client of the live server, once its worker is up (a build needs one)."""
    with Sandhive(live.base_url, api_key=key) as sandhive:
        deadline = time.monotonic() + 60
        while not any(image.available for image in sandhive.images.list()):
            assert time.monotonic() < deadline, f"no worker came up:\n{live.logs()}"
            time.sleep(0.1)
        yield sandhive


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def write_context(directory: Path) -> None:
    (directory / "data").mkdir(parents=True)
    (directory / "notes.txt").write_text("copied from the context\n")
    (directory / "data" / "more.txt").write_text("more\n")
    (directory / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (directory / "run.sh").chmod(0o755)
    (directory / "link").symlink_to("notes.txt")


def test_a_context_directory_builds_into_an_image_a_sandbox_starts_from(
    client: Sandhive, tmp_path: Path
) -> None:
    context = tmp_path / "context"
    write_context(context)
    dockerfile = tmp_path / "Dockerfile"  # a Path: read by the client
    dockerfile.write_text(DOCKERFILE)
    name = unique("hello")

    built = client.images.build(
        name, dockerfile, context=context, build_args={"GREETING": "hi"}, description="greeting"
    )
    assert isinstance(built, ImageBuild)
    assert (built.name, built.image, built.status, built.ready) == (
        name,
        f"built/{name}",
        "ready",
        True,
    )
    assert (built.base, built.workdir, built.user, built.description) == (
        "default",
        "/srv/app",
        None,
        "greeting",
    )
    assert built.env["GREETING_FILE"] == "/opt/greeting/message.txt"
    assert "RUN mkdir -p /opt/greeting" in built.log, built.log
    assert built.built_at is not None

    # packed again, the same bytes: the server answers the image it built
    again = client.images.build(name, DOCKERFILE, context=context, build_args={"GREETING": "hi"})
    assert (again.digest, again.built_at) == (built.digest, built.built_at)

    assert client.images.get_build(name).digest == built.digest
    assert [b.name for b in client.images.list_builds()] == [name]
    listed = {image.name: image for image in client.images.list()}
    assert isinstance(listed[built.image], Image)
    assert listed["default"].max is not None

    with client.sandboxes.create(built.image, ttl_s=120) as sandbox:
        assert sandbox.info.image == built.image
        shown = sandbox.exec(
            'cat "$GREETING_FILE" notes.txt data/more.txt && readlink link && ./run.sh && pwd',
            cwd=built.workdir,
            env=built.env,
        )
        assert shown.stdout_text == (
            "hi from the build\ncopied from the context\nmore\nnotes.txt\nran\n/srv/app\n"
        ), shown.stderr_text

    client.images.delete_build(name)
    with pytest.raises(NotFound):
        client.images.get_build(name)
    assert built.image not in [image.name for image in client.images.list()]


def test_a_failing_step_raises_image_build_failed_with_the_log_and_a_refused_base_invalid_input(
    client: Sandhive,
) -> None:
    name = unique("broken")
    failing = "FROM default\nRUN echo building; echo no compiler >&2; exit 3\n"
    with pytest.raises(ImageBuildFailed) as failed:
        client.images.build(name, failing)
    assert isinstance(failed.value, InvalidInput)  # a 422, as a refused Dockerfile is
    assert (failed.value.status, failed.value.code, failed.value.name) == (
        422,
        "build_failed",
        name,
    )
    assert "no compiler" in failed.value.log, failed.value.log
    assert "returned a non-zero code: 3" in failed.value.message, failed.value.message
    recorded = client.images.get_build(name)
    assert (recorded.status, recorded.ready) == ("failed", False)
    assert recorded.error

    with pytest.raises(InvalidInput) as refused:
        client.images.build(unique("outside"), "FROM python:3.12-slim\nRUN true\n")
    assert not isinstance(refused.value, ImageBuildFailed)
    assert refused.value.code == "invalid_input"
    assert refused.value.details[0]["loc"] == ["body", "dockerfile"]
    assert "python:3.12-slim" in refused.value.message


async def test_the_async_client_builds_from_archive_bytes_and_the_harbor_helper_reuses_it(
    client: Sandhive, live: Cluster, key: str, tmp_path: Path
) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:  # a plain tar, sent as it is
        data = b"from the archive\n"
        info = tarfile.TarInfo("notes.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    name = unique("bytes")
    async with AsyncSandhive(live.base_url, api_key=key) as sandhive:
        built = await sandhive.images.build(
            name, "FROM default\nCOPY notes.txt /opt/\n", context=raw.getvalue()
        )
        assert built.ready
        assert [b.name for b in await sandhive.images.list_builds()] == [name]
        assert (await sandhive.images.get_build(name)).digest == built.digest
        assert built.image in [image.name for image in await sandhive.images.list()]
        await sandhive.images.delete_build(name)
        with pytest.raises(NotFound):
            await sandhive.images.delete_build(name)

        # Harbor's server builds: the folder built under its content's name, then found
        environment = tmp_path / "environment"
        environment.mkdir()
        (environment / "Dockerfile").write_text("FROM default\nCOPY notes.txt /opt/\n")
        (environment / "notes.txt").write_text("harbor\n")
        task = harbor_build.image_name("My Task", environment)
        first = await harbor_build.ensure_image(sandhive, environment, task, timeout_s=120)
        found = await harbor_build.ensure_image(sandhive, environment, task, timeout_s=120)
        assert first.image == found.image == f"built/{task}"
        assert found.built_at == first.built_at


async def test_a_server_without_image_builds_refuses_them_as_forbidden(
    settings: Settings, key: str, tmp_path: Path
) -> None:
    off = settings.model_copy(update={"image_builds": False})
    environment = tmp_path / "environment"
    environment.mkdir()
    (environment / "Dockerfile").write_text("FROM default\n")
    with cluster(off, tmp_path) as procs:
        procs.start_api()
        with Sandhive(procs.base_url, api_key=key) as sandhive:
            with pytest.raises(Forbidden) as refused:
                sandhive.images.build(unique("off"), "FROM default\n")
        assert refused.value.code == "image_builds_disabled"
        async with AsyncSandhive(procs.base_url, api_key=key) as client:
            with pytest.raises(harbor_build.BuildsDisabled):  # Harbor's `auto` then replays
                await harbor_build.ensure_image(client, environment, "harbor-off", timeout_s=30)


def test_a_directory_packs_to_the_same_archive_each_time_symlinks_kept(tmp_path: Path) -> None:
    write_context(tmp_path)
    packed = pack_directory(tmp_path)
    assert pack_directory(tmp_path) == packed
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
        members = {member.name: member for member in tar}
    assert sorted(members) == ["data", "data/more.txt", "link", "notes.txt", "run.sh"]
    assert members["link"].issym()
    assert members["link"].linkname == "notes.txt"
    assert members["run.sh"].mode & 0o111
    assert {(m.uid, m.gid) for m in members.values()} == {(0, 0)}
