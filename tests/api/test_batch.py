"""`POST /v1/tasks/batch`: every task queued, in order, or none stored (422 / 429).

Run against the real app with real Postgres and Redis; the stored rows and the
Redis task stream are read back to show that a refused batch left nothing behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select

from app.api.app import create_app
from app.bus import keys
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from tests.api.conftest import assert_error, serve


async def count_tasks(sessions: Sessions) -> int:
    async with sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(models.Task)) or 0)


def batch(*tasks: dict[str, object]) -> dict[str, object]:
    return {"tasks": list(tasks)}


@pytest.fixture
async def tight_client(make_settings: Callable[..., Settings]) -> AsyncIterator[httpx.AsyncClient]:
    """A tenant allowed 3 active tasks, and batches of at most 4."""
    app = create_app(make_settings(tenant_max_active_tasks=3, max_batch_tasks=4))
    async with serve(app) as client:
        yield client


async def test_a_batch_queues_every_task_in_order(
    client: httpx.AsyncClient, sessions: Sessions, redis: Redis
) -> None:
    sent = batch(*({"prompt": f"task {i}", "metadata": {"i": i}} for i in range(5)))
    response = await client.post("/v1/tasks/batch", json=sent)
    assert response.status_code == 202, response.text
    body = response.json()
    assert [t["prompt"] for t in body["tasks"]] == [f"task {i}" for i in range(5)]
    assert [t["metadata"] for t in body["tasks"]] == [{"i": i} for i in range(5)]
    assert {t["status"] for t in body["tasks"]} == {"queued"}
    assert body["created"] == [True] * 5
    for task in body["tasks"]:
        assert (await client.get(f"/v1/tasks/{task['id']}")).json()["prompt"] == task["prompt"]
    assert await count_tasks(sessions) == 5
    assert await redis.xlen(keys.TASK_STREAM) == 5


async def test_one_invalid_task_refuses_the_batch_naming_its_index_and_field(
    client: httpx.AsyncClient, sessions: Sessions, redis: Redis
) -> None:
    # Caught by parsing: a type error in the fourth task.
    bad_type = batch(*([{"prompt": "ok"}] * 3), {"prompt": "x", "limits": {"max_steps": "9"}})
    error = assert_error(await client.post("/v1/tasks/batch", json=bad_type), 422, "invalid_input")
    assert error["message"].startswith("tasks.3.limits.max_steps: ")
    assert error["details"][0]["loc"] == ["body", "tasks", 3, "limits", "max_steps"]
    # Caught against the server's limits (SANDHIVE_MAX_MAX_STEPS), after parsing.
    over = batch({"prompt": "ok"}, {"prompt": "x", "limits": {"max_steps": 10**6}})
    error = assert_error(await client.post("/v1/tasks/batch", json=over), 422, "invalid_input")
    assert error["message"].startswith("tasks.1.limits.max_steps: ")
    assert error["details"][0]["loc"] == ["body", "tasks", 1, "limits", "max_steps"]
    # Caught while checking the input files.
    bad_path = batch(
        {"prompt": "ok"},
        {"prompt": "x", "input_files": [{"path": "../up", "content_base64": "eA=="}]},
    )
    error = assert_error(await client.post("/v1/tasks/batch", json=bad_path), 422, "invalid_input")
    assert error["message"].startswith("tasks.1.input_files.0.path: ")
    for empty in ({"tasks": []}, {"tasks": [{"prompt": "x"}], "other": 1}):
        assert_error(await client.post("/v1/tasks/batch", json=empty), 422, "invalid_input")
    assert await count_tasks(sessions) == 0
    assert await redis.xlen(keys.TASK_STREAM) == 0


async def test_a_batch_over_the_configured_size_is_422(
    tight_client: httpx.AsyncClient, sessions: Sessions
) -> None:
    sent = batch(*({"prompt": f"t{i}"} for i in range(5)))
    error = assert_error(
        await tight_client.post("/v1/tasks/batch", json=sent), 422, "invalid_input"
    )
    assert error["message"] == "tasks: at most 4 tasks in one batch, got 5"
    assert await count_tasks(sessions) == 0


async def test_a_batch_is_admitted_as_a_whole_or_429_with_nothing_stored(
    tight_client: httpx.AsyncClient, sessions: Sessions, redis: Redis
) -> None:
    first = await tight_client.post("/v1/tasks/batch", json=batch({"prompt": "a"}, {"prompt": "b"}))
    assert first.status_code == 202, first.text
    # 2 active + 2 more > 3: refused whole, though one alone would fit.
    refused = await tight_client.post(
        "/v1/tasks/batch", json=batch({"prompt": "c"}, {"prompt": "d"})
    )
    error = assert_error(refused, 429, "too_many_requests")
    assert refused.headers["Retry-After"] == "5"
    assert error["details"] == {"limit": "tenant_max_active_tasks", "value": 3}
    assert await count_tasks(sessions) == 2
    assert await redis.xlen(keys.TASK_STREAM) == 2
    fits = await tight_client.post("/v1/tasks/batch", json=batch({"prompt": "c"}))
    assert fits.status_code == 202, fits.text
    assert await count_tasks(sessions) == 3


async def test_each_task_has_its_own_idempotency_key(
    client: httpx.AsyncClient, sessions: Sessions, redis: Redis
) -> None:
    first = await client.post(
        "/v1/tasks/batch",
        json=batch(
            {"prompt": "a", "idempotency_key": "k-a"},
            {"prompt": "b"},
            {"prompt": "c", "idempotency_key": "k-c"},
        ),
    )
    assert first.status_code == 202, first.text
    ids = [t["id"] for t in first.json()["tasks"]]
    # A retry of the batch: the keyed tasks come back, the unkeyed one is new, a new key is new.
    again = await client.post(
        "/v1/tasks/batch",
        json=batch(
            {"prompt": "c", "idempotency_key": "k-c"},
            {"prompt": "b"},
            {"prompt": "a", "idempotency_key": "k-a"},
            {"prompt": "d", "idempotency_key": "k-d"},
        ),
    )
    assert again.status_code == 202, again.text
    body = again.json()
    assert body["created"] == [False, True, False, True]
    assert body["tasks"][0]["id"] == ids[2]
    assert body["tasks"][2]["id"] == ids[0]
    assert body["tasks"][1]["id"] not in ids
    assert await count_tasks(sessions) == 5
    assert await redis.xlen(keys.TASK_STREAM) == 5
    # The keys are the single submission's: POST /v1/tasks with one gets the batch's task.
    single = await client.post(
        "/v1/tasks", json={"prompt": "a"}, headers={"Idempotency-Key": "k-a"}
    )
    assert (single.status_code, single.json()["id"]) == (200, ids[0])


async def test_a_reused_or_repeated_key_refuses_the_whole_batch(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    stored = await client.post("/v1/tasks", json={"prompt": "a"}, headers={"Idempotency-Key": "k"})
    assert stored.status_code == 202
    reused = batch({"prompt": "new"}, {"prompt": "not a", "idempotency_key": "k"})
    error = assert_error(
        await client.post("/v1/tasks/batch", json=reused), 422, "idempotency_key_reused"
    )
    assert error["message"].startswith("tasks.1.idempotency_key: 'k' was used for a different")
    assert stored.json()["id"] in error["message"]
    assert error["details"][0]["loc"] == ["body", "tasks", 1, "idempotency_key"]
    twice = batch({"prompt": "x", "idempotency_key": "j"}, {"prompt": "y", "idempotency_key": "j"})
    error = assert_error(await client.post("/v1/tasks/batch", json=twice), 422, "invalid_input")
    assert error["message"] == "tasks.1.idempotency_key: 'j' is also the key of tasks.0"
    assert await count_tasks(sessions) == 1


async def test_two_racing_batches_with_the_same_keys_store_each_task_once(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    sent = batch(*({"prompt": f"t{i}", "idempotency_key": f"race-{i}"} for i in range(5)))
    answers = await asyncio.gather(*(client.post("/v1/tasks/batch", json=sent) for _ in range(4)))
    assert [a.status_code for a in answers] == [202] * 4, [a.text for a in answers]
    ids = {tuple(t["id"] for t in a.json()["tasks"]) for a in answers}
    assert len(ids) == 1  # every answer names the same five tasks
    assert sum(a.json()["created"].count(True) for a in answers) == 5
    assert await count_tasks(sessions) == 5
