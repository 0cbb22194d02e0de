"""Catalogue images on the real Docker daemon: built FROM the local base, run by the workers
that have them, waited for by those that do not, listed per tenant, kept warm per image.

The image `sandhive-test-extra` is built once for the module from a two-line Dockerfile
on the sandbox image (a file baked in at /opt/extra.txt) and removed at the end.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select
from typer.testing import CliRunner

from app.api.app import create_app
from app.bus import leases
from app.cli.main import cli
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.domain.image_catalogue import catalogue, warm_sizes
from app.errors import InvalidInput, Unavailable
from app.sandbox.docker import DockerHost
from app.sandbox.image import build_catalogue_image, has_image
from app.sandbox.policy import SandboxConfig
from app.sandbox.pool import WarmPool, pool_labels
from app.schemas.episodes import EpisodeCreate
from app.schemas.tasks import LLMOptions, SandboxRequest, TaskCreate
from app.scripted import Script, ScriptedLLMServer, Turn
from app.services.episodes import calls as episodes_calls
from app.services.tasks import service as tasks
from app.worker.images import ImageInventory
from app.worker.pool import Worker
from tests.api.conftest import serve

EXTRA = "sandhive-test-extra:latest"
ABSENT = "sandhive-test-extra-absent:latest"
DOCKERFILE = "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo extra-ok > /opt/extra.txt\n"
READ_IT = "cat /opt/extra.txt > output/answer.txt 2>&1 || echo no-file > output/answer.txt"


def catalogue_text(reference: str, warm: int = 0) -> str:
    return f"""
[images.extra]
reference = "{reference}"
dockerfile = "extra.Dockerfile"
description = "The base plus one file"
warm_pool_size = {warm}

[images.secret]
reference = "{reference}"
description = "Someone else's"
tenants = ["someone-else"]
"""


@pytest.fixture
def test_labels() -> dict[str, str]:
    """Labels unique to this test (the container audit accepts `sandhive.test` ones)."""
    return {"sandhive.test": uuid.uuid4().hex, "sandhive.task": "tsk_test", "sandhive.attempt": "1"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("images")
    (path / "extra.Dockerfile").write_text(DOCKERFILE)
    (path / "images.toml").write_text(catalogue_text(EXTRA))
    (path / "absent.toml").write_text(catalogue_text(ABSENT))
    (path / "warm.toml").write_text(catalogue_text(EXTRA, warm=1))
    return path


@pytest.fixture(scope="module")
def extra_image(folder: Path, docker_image: str) -> Iterator[str]:
    """`sandhive-test-extra` built FROM the sandbox image, as `sandhive image build extra`."""
    settings = Settings(
        _env_file=None, sandbox_image=docker_image, sandbox_images_file=folder / "images.toml"
    )
    image = catalogue(settings)["extra"]

    async def build() -> None:
        async with DockerHost() as host:
            await build_catalogue_image(host, image, base_image=docker_image)
            assert await has_image(host, EXTRA)
            assert not await has_image(host, ABSENT)

    asyncio.run(build())
    yield EXTRA
    subprocess.run(["docker", "rmi", "-f", EXTRA], capture_output=True, check=False)


def docker(*args: str) -> None:
    subprocess.run(["docker", *args], capture_output=True, check=False)


def on(settings: Settings, folder: Path, file: str = "images.toml") -> Settings:
    return settings.model_copy(update={"sandbox_images_file": folder / file})


def extra_task(scripted_llm: ScriptedLLMServer, image: str = "extra") -> TaskCreate:
    model = f"images-{uuid.uuid4().hex[:8]}"
    turns = [Turn(tool="execute_bash", arguments={"command": READ_IT}), Turn("submit")]
    scripted_llm.add_script(model, Script(turns=turns))
    return TaskCreate(prompt="p", llm=LLMOptions(model=model), sandbox=SandboxRequest(image=image))


@asynccontextmanager
async def worker_running(settings: Settings) -> AsyncIterator[Worker]:
    worker = Worker(settings)
    running = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        worker.stop()
        await asyncio.wait_for(running, 60)


async def test_tasks_run_on_their_own_image_and_default_ones_on_default(
    settings: Settings,
    redis: Redis,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
    folder: Path,
    extra_image: str,
) -> None:
    config = on(settings, folder)
    ids = []
    for image in ("extra", "default"):
        created, _ = await tasks.submit_task(
            sessions, redis, config, "default", extra_task(scripted_llm, image), None
        )
        ids.append(created.id)
    await Worker(config).run(burst=True)
    extra, default = [await tasks.get_task(sessions, "default", task_id) for task_id in ids]
    assert (extra.status, default.status) == ("succeeded", "succeeded"), (extra, default)
    assert (extra.answer, default.answer) == ("extra-ok\n", "no-file\n")
    assert (extra.sandbox.image, extra.sandbox.image_name) == (EXTRA, "extra")


async def test_a_worker_without_the_image_leaves_its_task_queued_for_one_that_has_it(
    settings: Settings,
    redis: Redis,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
    folder: Path,
    extra_image: str,
) -> None:
    lacking, having = on(settings, folder, "absent.toml"), on(settings, folder)
    created, _ = await tasks.submit_task(
        sessions, redis, having, "default", extra_task(scripted_llm), None
    )
    plain = Worker(lacking.model_copy(update={"worker_name": "w-lacking"}))
    await plain.run(burst=True)  # claims nothing it cannot run, then ends: its queue is empty
    waiting = await tasks.get_task(sessions, "default", created.id)
    assert (waiting.status, waiting.attempt) == ("queued", 0), waiting
    assert plain.images is not None
    assert plain.images.missing == ["extra", "secret"]
    assert plain.readiness.report()["images"].startswith("missing: extra, secret")
    await Worker(having).run(burst=True)
    done = await tasks.get_task(sessions, "default", created.id)
    assert (done.status, done.answer) == ("succeeded", "extra-ok\n"), done


async def test_images_are_listed_per_tenant_and_forbidden_ones_refused_storing_nothing(
    settings: Settings,
    redis: Redis,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
    folder: Path,
    extra_image: str,
) -> None:
    config = on(settings, folder)
    async with serve(create_app(config)) as client:
        before = (await client.get("/v1/images")).json()["images"]
        assert [(i["name"], i["available"]) for i in before] == [
            ("default", False),
            ("extra", False),
        ], "no live worker yet; `secret` is someone else's"
        async with worker_running(config) as worker:
            for _ in range(200):
                listed = (await client.get("/v1/images")).json()["images"]
                if all(i["available"] for i in listed):
                    break
                await asyncio.sleep(0.05)
            assert worker.images is not None
            assert worker.images.present == ["default", "extra", "secret"]
        extra = next(i for i in listed if i["name"] == "extra")
        assert extra["available"] is True
        assert extra["description"] == "The base plus one file"
        assert extra["max"] == {
            "cpus": config.max_cpus,
            "memory_mb": config.max_memory_mb,
            "disk_mb": config.max_disk_mb,
        }
        refused = await client.post(
            "/v1/tasks", json={"prompt": "p", "sandbox": {"image": "secret"}}
        )
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["details"][0]["available"] == ["default", "extra"]
        too_big = {"image": "extra", "cpus": config.max_cpus + 1}
        refused = await client.post("/v1/tasks", json={"prompt": "p", "sandbox": too_big})
        assert refused.status_code == 422, refused.text
    body = extra_task(scripted_llm, "secret")
    with pytest.raises(InvalidInput, match="'secret' is not available"):
        await tasks.submit_task(sessions, redis, config, "default", body, None)
    created, _ = await tasks.submit_task(sessions, redis, config, "someone-else", body, None)
    assert created.sandbox.image_name == "secret"
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(models.Task)) == 1


async def test_the_warm_pool_keeps_ready_sandboxes_per_image(
    docker_image: str, folder: Path, extra_image: str, test_labels: dict[str, str]
) -> None:
    config = Settings(
        _env_file=None, sandbox_image=docker_image, sandbox_images_file=folder / "warm.toml"
    )
    sizes = warm_sizes(catalogue(config))
    assert sizes == {docker_image: 0, EXTRA: 1}, "`secret` shares the reference, keeps 0"

    async with DockerHost() as host:
        labels = {**pool_labels("imagestest", "w-test"), **test_labels}
        pool = WarmPool(host, size=0, sizes=sizes, labels=labels)
        plain = SandboxConfig(image=docker_image, labels={}, memory_mb=256)
        extra = SandboxConfig(image=EXTRA, labels={}, memory_mb=256)
        try:
            assert pool.claim(plain) is None
            assert pool.claim(extra) is None
            await pool.wait_ready(extra)
            await asyncio.sleep(0.5)
            assert (pool.ready(plain), pool.ready(extra)) == (0, 1), "none for default"
            box = pool.claim(extra)
            assert box is not None
            done = await box.exec(["cat", "/opt/extra.txt"])
            assert done.stdout.strip() == b"extra-ok"
            await box.remove()
        finally:
            await pool.close()
            for container_id in await host.list_sandboxes(test_labels):
                await host.remove_container(container_id)


async def test_the_inventory_follows_an_image_appearing_on_the_host(
    docker_image: str, folder: Path, extra_image: str
) -> None:
    config = Settings(
        _env_file=None, sandbox_image=docker_image, sandbox_images_file=folder / "absent.toml"
    )
    async with DockerHost() as host:
        inventory = ImageInventory(config, host)
        await inventory.refresh()
        assert (inventory.present, inventory.missing) == (["default"], ["extra", "secret"])
        await asyncio.to_thread(docker, "tag", EXTRA, ABSENT)
        try:
            await inventory.refresh()
            assert inventory.missing == []
            assert inventory.readiness() == "ok"
            assert len(inventory.streams()) == 3
        finally:
            await asyncio.to_thread(docker, "rmi", ABSENT)


def test_sandhive_image_builds_a_catalogue_image_and_lists_the_catalogue(
    folder: Path, docker_image: str, extra_image: str
) -> None:
    env = {
        "SANDHIVE_SANDBOX_IMAGE": docker_image,
        "SANDHIVE_SANDBOX_IMAGES_FILE": str(folder / "images.toml"),
        "COLUMNS": "200",
    }
    built = CliRunner().invoke(cli, ["image", "build", "extra"], env=env)
    assert built.exit_code == 0, built.output
    assert f"extra: built {EXTRA}" in built.output
    listed = CliRunner().invoke(cli, ["image", "list"], env=env)
    assert listed.exit_code == 0, listed.output
    rows = {line.split("│")[1].strip(): line for line in listed.output.splitlines() if "│" in line}
    assert {"default", "extra", "secret"} <= set(rows)
    assert "yes" in rows["extra"]
    assert "someone-else" in rows["secret"]
    unknown = CliRunner().invoke(cli, ["image", "build", "nope"], env=env)
    assert unknown.exit_code == 1
    assert "there are: default, extra, secret" in unknown.output


async def test_an_episode_of_an_image_no_live_worker_has_is_refused_at_once(
    settings: Settings, redis: Redis, sessions: Sessions, folder: Path
) -> None:
    config = on(settings, folder)
    await leases.beat(redis, "w-plain", 10_000, {"images": ["default"]})
    body = EpisodeCreate(prompt="p", sandbox=SandboxRequest(image="extra"))
    with pytest.raises(Unavailable, match="no live worker has the image 'extra'"):
        await episodes_calls.open_episode(sessions, redis, config, "default", body)
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(models.EpisodeRow)) == 0
