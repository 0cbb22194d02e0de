"""The per-image queue's review findings, on the real daemon, Postgres and Redis: a task of
an image this host lacks never starts here, a removed image's tasks fail instead of waiting
forever and show on /metrics, and a broken catalogue file still lets default's tasks run."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from sqlalchemy import func, select, update

from app.api.app import create_app
from app.bus import keys, leases, queue
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.episode import Runner
from app.ids import utc_now
from app.resources import open_resources
from app.sandbox.docker import DockerHost
from app.scripted import ScriptedLLMServer
from app.services import tasks
from app.worker.context import WorkerContext
from app.worker.pool import Worker
from app.worker.reconcile import Reconciler
from tests.api.conftest import serve
from tests.images.test_images_worker import extra_task, on

EXTRA_STREAM = keys.task_stream("extra")


async def test_a_task_of_an_image_this_host_lacks_is_moved_off_the_default_stream(
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
    # As a worker of the release before the catalogue re-enqueues it: on the default stream.
    await redis.delete(EXTRA_STREAM)
    await queue.enqueue(redis, created.id)
    await Worker(lacking.model_copy(update={"worker_name": "w-lacking"})).run(burst=True)
    waiting = await tasks.get_task(sessions, "default", created.id)
    assert (waiting.status, waiting.attempt) == ("queued", 0), waiting
    assert await queue.messages_of(redis, keys.TASK_STREAM) == {}
    assert list((await queue.messages_of(redis, EXTRA_STREAM)).values()) == [created.id]
    assert not await redis.exists(keys.task_lease(created.id))
    await Worker(having).run(burst=True)
    done = await tasks.get_task(sessions, "default", created.id)
    assert (done.status, done.attempt, done.answer) == ("succeeded", 1, "extra-ok\n"), done


async def test_a_broken_catalogue_file_still_lets_default_tasks_run(
    settings: Settings,
    redis: Redis,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
    tmp_path: Path,
) -> None:
    (tmp_path / "broken.toml").write_text("[images.extra\n")
    broken = settings.model_copy(update={"sandbox_images_file": tmp_path / "broken.toml"})
    created, _ = await tasks.submit_task(
        sessions, redis, settings, "default", extra_task(scripted_llm, "default"), None
    )
    worker = Worker(broken)
    await worker.run(burst=True)
    done = await tasks.get_task(sessions, "default", created.id)
    assert (done.status, done.answer) == ("succeeded", "no-file\n"), done
    report = worker.readiness.report()["images"]
    assert report.startswith(f"failed: image catalogue {tmp_path / 'broken.toml'}"), report
    assert report.endswith("(only default's tasks are claimed)"), report


def image_samples(text: str, image: str) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("sandhive_image_") and sample.labels.get("image") == image
    }


async def test_a_waiting_image_shows_on_metrics_and_fails_once_removed_from_the_catalogue(
    settings: Settings,
    redis: Redis,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
    folder: Path,
    tmp_path: Path,
) -> None:
    having = on(settings, folder)
    created, _ = await tasks.submit_task(
        sessions, redis, having, "default", extra_task(scripted_llm), None
    )
    async with serve(create_app(having)) as client:
        figures = image_samples((await client.get("/metrics")).text, "extra")
        assert figures["sandhive_image_waiting"] == 1
        assert figures["sandhive_image_workers"] == 0, "no live worker has it: it would wait"
        assert figures["sandhive_image_oldest_waiting_age_seconds"] >= 0
        await leases.beat(redis, "w-extra", 10_000, {"images": ["default", "extra"]})
        figures = image_samples((await client.get("/metrics")).text, "extra")
        assert figures["sandhive_image_workers"] == 1
    async with sessions.begin() as session:  # past reconciliation's settling time
        old = utc_now() - timedelta(minutes=1)
        await session.execute(
            update(models.Task).where(models.Task.id == created.id).values(created_at=old)
        )
    (tmp_path / "broken.toml").write_text("[images.extra\n")
    broken = settings.model_copy(update={"sandbox_images_file": tmp_path / "broken.toml"})
    await reconcile_once(broken)
    kept = await tasks.get_task(sessions, "default", created.id)
    assert kept.status == "queued", "a broken file fails nothing"
    await reconcile_once(settings)  # the file without `extra`: no catalogue at all
    failed = await tasks.get_task(sessions, "default", created.id)
    assert (failed.status, failed.finish_reason) == ("failed", "sandbox_error"), failed
    assert failed.error is not None
    assert failed.error.startswith("image_unavailable: image 'extra' is no longer"), failed
    assert await queue.messages_of(redis, EXTRA_STREAM) == {}


async def reconcile_once(settings: Settings) -> None:
    async with open_resources(settings) as res:
        ctx = WorkerContext.of(res, Runner(settings, DockerHost()), "w-reconcile", "test")
        await Reconciler(ctx).run_once()


async def test_a_server_may_refuse_tasks_of_an_image_no_live_worker_has(
    settings: Settings, redis: Redis, sessions: Sessions, folder: Path
) -> None:
    strict = on(settings, folder).model_copy(update={"refuse_tasks_without_image_worker": True})
    extra = {"prompt": "p", "sandbox": {"image": "extra"}}
    async with serve(create_app(strict)) as client:
        refused = await client.post("/v1/tasks", json=extra)
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == str(strict.unavailable_retry_after_s)
        error = refused.json()["error"]
        assert (error["code"], error["details"]) == ("no_worker_for_image", {"image": "extra"})
        batch = await client.post("/v1/tasks/batch", json={"tasks": [{"prompt": "p"}, extra]})
        assert batch.status_code == 503, batch.text
        plain = await client.post("/v1/tasks", json={"prompt": "p"})
        assert plain.status_code in (201, 202), "default's tasks are never refused"
        async with sessions() as session:
            assert await session.scalar(select(func.count()).select_from(models.Task)) == 1
        await leases.beat(redis, "w-extra", 10_000, {"images": ["default", "extra"]})
        accepted = await client.post("/v1/tasks", json=extra)
        assert accepted.status_code in (201, 202), accepted.text
