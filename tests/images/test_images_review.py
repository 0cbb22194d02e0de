"""The per-image queue's review findings, on the real daemon, Postgres and Redis: a task of
an image this host lacks never starts here, a removed image's tasks fail instead of waiting
forever and show on /metrics (queued ones, and a dead worker's running ones), and a broken
catalogue file still lets default's tasks run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
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
from app.ids import utc_now
from app.resources import open_resources
from app.runner.episode import Runner
from app.sandbox.docker import DockerHost
from app.schemas.tasks import TaskCreate
from app.scripted import ScriptedLLMServer
from app.services.tasks import attempts, image_failures
from app.services.tasks import service as tasks
from app.worker import taking
from app.worker.context import WorkerContext
from app.worker.pool import Worker
from app.worker.reconcile import Reconciler
from tests.api.conftest import serve
from tests.images.test_images_worker import extra_task, on

EXTRA_STREAM = keys.task_stream("extra")
LEASE_S = 0.3


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


async def start_on(redis: Redis, sessions: Sessions, worker: str, lease_s: float) -> str:
    """As a worker does: take the next message of `extra`'s stream, start attempt 1."""
    taken = await taking.take(
        redis, worker, lease_ms=int(lease_s * 1000), reclaim=False, block_ms=100,
        streams=[EXTRA_STREAM],
    )  # fmt: skip
    assert taken is not None
    started = await attempts.start_attempt(sessions, redis, taken.task_id, worker, max_attempts=3)
    assert started is not None
    return taken.task_id


async def submit_old(sessions: Sessions, redis: Redis, having: Settings, task: TaskCreate) -> None:
    await tasks.submit_task(sessions, redis, having, "default", task, None)
    async with sessions.begin() as session:  # past reconciliation's settling time
        await session.execute(
            update(models.Task).values(created_at=utc_now() - timedelta(minutes=1))
        )


@asynccontextmanager
async def short_lease_reconciler(settings: Settings) -> AsyncIterator[Reconciler]:
    """A worker's reconciliation, with leases of `LEASE_S`."""
    plain = settings.model_copy(update={"worker_lease_s": LEASE_S})
    async with open_resources(plain) as res:
        yield Reconciler(WorkerContext.of(res, Runner(plain, DockerHost()), "w-rec", "t"))


async def test_a_dead_workers_running_task_of_a_removed_image_fails(
    settings: Settings,
    redis: Redis,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
    folder: Path,
) -> None:
    having = on(settings, folder)
    await queue.ensure_group(redis, [EXTRA_STREAM])  # as a worker with `extra` does at start
    for _ in range(2):
        await submit_old(sessions, redis, having, extra_task(scripted_llm))
    # Two workers start one each; the first dies (its lease lapses, its message stays pending
    # on `extra`'s stream), the second still runs its own. Then `extra` leaves the catalogue.
    dead = await start_on(redis, sessions, "w-dead", LEASE_S)
    alive = await start_on(redis, sessions, "w-alive", 60)
    await asyncio.sleep(LEASE_S + 0.1)  # the dead worker's lease lapses
    async with short_lease_reconciler(settings) as reconciler:
        assert await reconciler.run_once() == []
        kept = await tasks.get_task(sessions, "default", dead)
        assert kept.status == "running", "a lease may be in flux: it gets a lease period"
        await asyncio.sleep(LEASE_S + 0.1)
        assert await reconciler.run_once() == [], "not enqueued again on a stream nobody reads"
    failed = await tasks.get_task(sessions, "default", dead)
    assert (failed.status, failed.finish_reason) == ("failed", "sandbox_error"), failed
    assert failed.error is not None
    assert failed.error.startswith("image_unavailable: image 'extra' is no longer"), failed
    assert await redis.exists(keys.cancel_flag(dead))
    running = await tasks.get_task(sessions, "default", alive)
    assert running.status == "running", "a live worker's attempt finishes on its own"
    assert list((await queue.messages_of(redis, EXTRA_STREAM)).values()) == [alive]


async def test_a_removed_images_task_whose_next_attempt_started_is_not_failed(
    settings: Settings,
    redis: Redis,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
    folder: Path,
) -> None:
    """During a rollout a worker whose catalogue still lists the image takes a dead worker's
    message back and starts attempt 2: the wait for a whole lease period starts again."""
    await queue.ensure_group(redis, [EXTRA_STREAM])
    await submit_old(sessions, redis, on(settings, folder), extra_task(scripted_llm))
    task_id = await start_on(redis, sessions, "w-dead", LEASE_S)
    await asyncio.sleep(LEASE_S + 0.1)  # attempt 1's lease lapses
    async with short_lease_reconciler(settings) as reconciler:
        await reconciler.run_once()  # attempt 1 seen without a lease: its wait starts
        lease_ms = int(LEASE_S * 1000)
        taken = await taking.take(
            redis, "w-rollout", lease_ms=lease_ms, reclaim=True, block_ms=100,
            streams=[EXTRA_STREAM],
        )  # fmt: skip
        assert taken is not None
        assert taken.task_id == task_id
        again = await attempts.start_attempt(sessions, redis, task_id, "w-rollout", max_attempts=3)
        assert again is not None
        assert again.attempt == 2
        await asyncio.sleep(LEASE_S + 0.1)  # that worker dies too: attempt 2 unleased, newly
        await reconciler.run_once()
        kept = await tasks.get_task(sessions, "default", task_id)
        assert (kept.status, kept.attempt) == ("running", 2), "attempt 2 gets its own wait"
        await asyncio.sleep(LEASE_S + 0.1)
        await reconciler.run_once()
    failed = await tasks.get_task(sessions, "default", task_id)
    assert (failed.status, failed.finish_reason) == ("failed", "sandbox_error"), failed


async def test_a_lost_attempt_is_failed_only_while_unleased_and_current(
    settings: Settings,
    redis: Redis,
    sessions: Sessions,
    scripted_llm: ScriptedLLMServer,
    folder: Path,
) -> None:
    """The checks under the row's lock: a lease held again (a start in flight), or another
    attempt than the one reconciliation saw lost, leaves the task alone."""
    await queue.ensure_group(redis, [EXTRA_STREAM])
    await submit_old(sessions, redis, on(settings, folder), extra_task(scripted_llm))
    task_id = await start_on(redis, sessions, "w-other", 60)  # attempt 1, lease held
    fail = image_failures.fail_unavailable
    assert await fail(sessions, redis, [task_id], "extra", lost={task_id: 1}) == []
    await redis.delete(keys.task_lease(task_id))  # its worker died: the lease is gone
    assert await fail(sessions, redis, [task_id], "extra", lost={task_id: 2}) == []
    assert await fail(sessions, redis, [task_id], "extra") == []
    kept = await tasks.get_task(sessions, "default", task_id)
    assert kept.status == "running"
    assert not await redis.exists(keys.cancel_flag(task_id))
    assert await fail(sessions, redis, [task_id], "extra", lost={task_id: 1}) == [task_id]
    failed = await tasks.get_task(sessions, "default", task_id)
    assert (failed.status, failed.finish_reason) == ("failed", "sandbox_error"), failed


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
