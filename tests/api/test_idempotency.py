"""Idempotency-Key over HTTP: a retry gets the first task, a key reused for another task a 422.

"The same submission" is the parsed task with its input files' bytes: the JSON
and the multipart form of one task match, a different prompt, option or file
does not. Rows stored before fingerprints were kept answer every repeat as a retry.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
from redis.asyncio import Redis
from sqlalchemy import func, select

from app.bus import keys
from app.db import models
from app.db.engine import Sessions
from tests.api.conftest import assert_error
from tests.support.rows import insert_task

TASK = {
    "prompt": "sum the table",
    "limits": {"max_steps": 7},
    "input_files": [{"path": "table.csv", "content_base64": base64.b64encode(b"1,2\n").decode()}],
    "metadata": {"ticket": 42, "team": "a"},
}


async def count_tasks(sessions: Sessions) -> int:
    async with sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(models.Task)) or 0)


async def post(client: httpx.AsyncClient, key: str, **send: Any) -> httpx.Response:
    return await client.post("/v1/tasks", headers={"Idempotency-Key": key}, **send)


async def test_a_key_reused_for_a_different_task_is_422_and_stores_nothing(
    client: httpx.AsyncClient, sessions: Sessions, redis: Redis
) -> None:
    first = await post(client, "order-1", json=TASK)
    assert first.status_code == 202, first.text
    changes = [
        {**TASK, "prompt": "sum the other table"},
        {**TASK, "limits": {"max_steps": 8}},
        {**TASK, "metadata": {"ticket": 43, "team": "a"}},
        {**TASK, "input_files": [{"path": "table.csv", "content_base64": "MSwzCg=="}]},
        {**TASK, "input_files": []},
    ]
    for body in changes:
        error = assert_error(
            await post(client, "order-1", json=body), 422, "idempotency_key_reused"
        )
        assert "order-1" in error["message"]
        assert first.json()["id"] in error["message"]
        assert error["details"][0]["loc"] == ["header", "Idempotency-Key"]
    assert await count_tasks(sessions) == 1
    assert await redis.xlen(keys.TASK_STREAM) == 1


async def test_a_retry_of_the_same_task_in_any_spelling_gets_the_first(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    first = await post(client, "order-2", json=TASK)
    assert first.status_code == 202, first.text
    as_json = {"content-type": "application/json"}
    task_part = {"task": json.dumps({k: v for k, v in TASK.items() if k != "input_files"})}
    same: list[dict[str, Any]] = [
        {"json": TASK},
        {"content": json.dumps(dict(reversed(TASK.items()))), "headers": as_json},
        {"json": {**TASK, "metadata": {"team": "a", "ticket": 42}, "prompt_config": "general"}},
        {"data": task_part, "files": [("file", ("table.csv", b"1,2\n", "text/csv"))]},
    ]
    for send in same:
        headers = {"Idempotency-Key": "order-2", **send.pop("headers", {})}
        again = await client.post("/v1/tasks", headers=headers, **send)
        assert again.status_code == 200, again.text
        assert again.json() == first.json()
    # The multipart form with another file's bytes is another task.
    other_file = [("file", ("table.csv", b"9,9\n", "text/csv"))]
    refused = await post(client, "order-2", data=task_part, files=other_file)
    assert_error(refused, 422, "idempotency_key_reused")
    assert await count_tasks(sessions) == 1


async def test_a_key_stored_before_fingerprints_answers_any_repeat_as_a_retry(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    old = await insert_task(sessions, idempotency_key="from-last-release")
    again = await post(client, "from-last-release", json={"prompt": "whatever it was"})
    assert (again.status_code, again.json()["id"]) == (200, old)
    # A fresh key keeps what was submitted from the start.
    assert (await post(client, "fresh", json={"prompt": "p"})).status_code == 202
    reused = await post(client, "fresh", json={"prompt": "q"})
    assert_error(reused, 422, "idempotency_key_reused")
