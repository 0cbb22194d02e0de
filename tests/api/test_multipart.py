"""POST /v1/tasks as multipart/form-data: a `task` JSON part plus file parts."""

from __future__ import annotations

import base64
import json

import httpx
from redis.asyncio import Redis
from sqlalchemy import select

from app.api.app import create_app
from app.bus import keys
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from tests.api.conftest import assert_error, serve


async def stored_inputs(sessions: Sessions) -> dict[str, bytes]:
    async with sessions() as session:
        return {b.path: b.content for b in await session.scalars(select(models.InputBlob))}


async def test_file_parts_become_input_files(
    client: httpx.AsyncClient, sessions: Sessions, redis: Redis
) -> None:
    task = {
        "prompt": "sum the table",
        "input_files": [{"path": "inline.txt", "content_base64": base64.b64encode(b"i").decode()}],
    }
    response = await client.post(
        "/v1/tasks",
        data={"task": json.dumps(task)},
        files=[
            ("file", ("table.csv", b"a,b\n1,2\n", "text/csv")),
            ("file", ("blob.bin", bytes(range(256)), "application/octet-stream")),
        ],
        headers={"Idempotency-Key": "mp-1"},
    )
    assert response.status_code == 202, response.text
    assert response.json()["prompt"] == "sum the table"
    assert response.headers["location"] == f"/v1/tasks/{response.json()['id']}"
    assert await stored_inputs(sessions) == {
        "inline.txt": b"i",
        "table.csv": b"a,b\n1,2\n",
        "blob.bin": bytes(range(256)),
    }
    assert await redis.xlen(keys.TASK_STREAM) == 1


async def test_the_task_part_may_itself_be_a_file(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/tasks", files=[("task", ("task.json", b'{"prompt": "p"}', "application/json"))]
    )
    assert response.status_code == 202, response.text


async def test_a_multipart_repeat_is_idempotent(client: httpx.AsyncClient) -> None:
    send = {"data": {"task": '{"prompt": "p"}'}, "files": [("f", ("a.txt", b"a"))]}
    first = await client.post("/v1/tasks", headers={"Idempotency-Key": "k"}, **send)
    again = await client.post("/v1/tasks", headers={"Idempotency-Key": "k"}, **send)
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json()["id"] == again.json()["id"]


async def test_refused_multipart_submissions_store_nothing(
    client: httpx.AsyncClient, sessions: Sessions, redis: Redis
) -> None:
    file = [("f", ("a.txt", b"a"))]
    cases = [
        ({"other": "x"}, file, "needs a `task` part"),
        ({"task": "{not json"}, file, "not valid JSON"),
        ({"task": "[1]"}, file, "JSON object"),
        ({"task": '{"prompt": 3}'}, file, "not valid"),
        ({"task": '{"prompt": "p"}'}, [("f", ("../escape", b"a"))], "relative path"),
        ({"task": '{"prompt": "p", "limits": {"max_steps": 99999}}'}, file, "max_steps"),
    ]
    for data, files, message in cases:
        response = await client.post("/v1/tasks", data=data, files=files)
        error = assert_error(response, 422, "invalid_input")
        assert message in error["message"], error
    assert await stored_inputs(sessions) == {}
    assert await redis.xlen(keys.TASK_STREAM) == 0


async def test_an_oversized_file_part_is_413(api_settings: Settings, redis: Redis) -> None:
    small = api_settings.model_copy(update={"max_input_file_bytes": 4})
    async with serve(create_app(small)) as client:
        response = await client.post(
            "/v1/tasks", data={"task": '{"prompt": "p"}'}, files=[("f", ("a", b"12345"))]
        )
    assert_error(response, 413, "too_large")
    assert await redis.xlen(keys.TASK_STREAM) == 0


async def test_openapi_documents_both_bodies(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    content = spec["paths"]["/v1/tasks"]["post"]["requestBody"]["content"]
    assert {"application/json", "multipart/form-data"} <= set(content)


async def test_input_files_that_are_not_a_list_answer_422(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    for listed in (5, {"a": 1}, "x"):
        task = json.dumps({"prompt": "p", "input_files": listed})
        response = await client.post(
            "/v1/tasks", data={"task": task}, files=[("f", ("a.txt", b"a"))]
        )
        assert_error(response, 422, "invalid_input")
    async with sessions() as session:
        assert (await session.scalars(select(models.Task))).all() == []
