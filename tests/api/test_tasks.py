"""/v1/tasks over HTTP: submit, refuse, repeat, read, list and page, trajectory; error shapes."""

from __future__ import annotations

import base64
from typing import Any

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
from tests.support.rows import insert_step, insert_task, insert_tasks


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def count_tasks(sessions: Sessions) -> int:
    async with sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(models.Task)) or 0)


async def test_submit_answers_202_and_stores_queues_and_records_the_task(
    client: httpx.AsyncClient, sessions: Sessions, redis: Redis, api_settings: Settings
) -> None:
    payload = {
        "prompt": "Compute the 10th Catalan number",
        "input_files": [{"path": "data/n.txt", "content_base64": b64(b"10")}],
        "metadata": {"ticket": 7},
    }
    response = await client.post("/v1/tasks", json=payload)

    assert response.status_code == 202, response.text
    task = response.json()
    assert response.headers["location"] == f"/v1/tasks/{task['id']}"
    assert task["id"].startswith("tsk_")
    assert task["status"] == "queued"
    assert task["finish_reason"] is None
    assert task["attempt"] == 0
    assert task["answer"] is None
    assert task["error"] is None
    assert task["started_at"] is None
    assert task["finished_at"] is None
    assert task["created_at"].endswith(("Z", "+00:00"))
    assert task["prompt"] == payload["prompt"]
    assert task["metadata"] == {"ticket": 7}
    assert task["usage"] == {
        "steps": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "llm_seconds": 0.0,
        "sandbox_seconds": 0.0,
    }
    assert task["llm"] == {
        "profile": "default",
        "model": "test-model",
        "temperature": api_settings.default_temperature,
        "max_tokens_per_call": api_settings.default_max_tokens_per_call,
        "extra_body": {},
        "base_url": None,
        "capture": False,
        "tokens": "chat",
    }
    assert task["limits"] == {
        "max_steps": api_settings.default_max_steps,
        "timeout_s": api_settings.default_timeout_s,
        "command_timeout_s": api_settings.default_command_timeout_s,
        "max_context_tokens": api_settings.default_max_context_tokens,
    }
    assert task["sandbox"] == {
        "image": api_settings.sandbox_image,
        "image_name": "default",
        "network": "none",
        "cpus": api_settings.default_cpus,
        "memory_mb": api_settings.default_memory_mb,
        "disk_mb": api_settings.default_disk_mb,
        "allow_domains": [],
        "read_only_rootfs": True,
        "built": None,
        "snapshots": "off",
    }
    assert task["tools"] == {"profile": "standard", "answer_all_tool_calls": True, "shell": "fresh"}
    assert task["prompt_config"] == "general"

    async with sessions() as session:
        row = await session.get(models.Task, task["id"])
        blob = await session.get(models.InputBlob, (task["id"], "data/n.txt"))
        events = (await session.scalars(select(models.Event))).all()
    assert row is not None
    assert (row.tenant_id, row.status) == ("default", "queued")
    assert blob is not None
    assert blob.content == b"10"
    assert [(e.task_id, e.seq, e.type) for e in events] == [(task["id"], 1, "task.queued")]
    messages = await redis.xrange(keys.TASK_STREAM)
    assert [fields for _, fields in messages] == [{b"task_id": task["id"].encode()}]


async def test_the_submitted_task_reads_back_the_same(client: httpx.AsyncClient) -> None:
    created = (await client.post("/v1/tasks", json={"prompt": "p"})).json()
    response = await client.get(f"/v1/tasks/{created['id']}")
    assert response.status_code == 200
    assert response.json() == created


MANY_FILES = [{"path": f"f{i}", "content_base64": ""} for i in range(101)]
REFUSED: list[tuple[str, Any, int]] = [
    ("missing prompt", {}, 422),
    ("empty prompt", {"prompt": ""}, 422),
    ("whitespace-only prompt", {"prompt": " \n\t "}, 422),
    ("prompt not a string", {"prompt": 5}, 422),
    ("unknown field", {"prompt": "p", "bogus": 1}, 422),
    ("unknown nested field", {"prompt": "p", "limits": {"steps": 3}}, 422),
    ("max_steps above maximum", {"prompt": "p", "limits": {"max_steps": 100000}}, 422),
    ("cpus above maximum", {"prompt": "p", "sandbox": {"cpus": 64}}, 422),
    ("egress", {"prompt": "p", "sandbox": {"network": "egress"}}, 422),
    ("unknown profile", {"prompt": "p", "llm": {"profile": "nope"}}, 422),
    ("unknown tools profile", {"prompt": "p", "tools": {"profile": "x"}}, 422),
    ("bad base64", {"prompt": "p", "input_files": [{"path": "a", "content_base64": "@@"}]}, 422),
    ("path escapes", {"prompt": "p", "input_files": [{"path": "../x", "content_base64": ""}]}, 422),
    ("absolute path", {"prompt": "p", "input_files": [{"path": "/x", "content_base64": ""}]}, 422),
    ("too many files", {"prompt": "p", "input_files": MANY_FILES}, 422),
    ("not an object", ["prompt"], 422),
]


@pytest.mark.parametrize(
    ("payload", "status"), [(p, s) for _, p, s in REFUSED], ids=[r[0] for r in REFUSED]
)
async def test_refused_submissions_store_nothing(
    client: httpx.AsyncClient, sessions: Sessions, redis: Redis, payload: Any, status: int
) -> None:
    response = await client.post("/v1/tasks", json=payload)
    error = assert_error(response, status, "invalid_input")
    assert isinstance(error["details"], list)
    assert error["details"]
    assert all({"loc", "msg", "type"} <= set(d) for d in error["details"])
    assert await count_tasks(sessions) == 0
    assert await redis.xlen(keys.TASK_STREAM) == 0


async def test_a_blank_prompt_is_named_in_the_refusal(client: httpx.AsyncClient) -> None:
    error = assert_error(
        await client.post("/v1/tasks", json={"prompt": "  \n"}), 422, "invalid_input"
    )
    assert [(d["loc"], d["msg"]) for d in error["details"]] == [
        (["body", "prompt"], "Value error, must hold some text, not only whitespace")
    ]


async def test_a_body_that_is_not_json_is_located_or_told_to_be_json(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    broken = b'{"prompt": "p",\n  "limits": }'
    headers = {"content-type": "application/json"}
    error = assert_error(
        await client.post("/v1/tasks", content=broken, headers=headers), 422, "invalid_input"
    )
    said = "the body is not valid JSON: Expecting value at line 2 column 13"
    assert error["message"] == said
    assert error["details"] == [{"loc": ["body", 28], "msg": said, "type": "json_invalid"}]
    form = await client.post("/v1/tasks", data={"prompt": "p"})
    assert assert_error(form, 422, "invalid_input")["message"] == (
        "the body must be JSON, sent with Content-Type: application/json; this one came as "
        "application/x-www-form-urlencoded"
    )
    assert await count_tasks(sessions) == 0


async def test_every_violated_maximum_is_listed(client: httpx.AsyncClient) -> None:
    payload = {"prompt": "p", "limits": {"max_steps": 100000}, "sandbox": {"cpus": 64}}
    error = assert_error(await client.post("/v1/tasks", json=payload), 422, "invalid_input")
    by_loc = {tuple(d["loc"]): d for d in error["details"]}
    assert by_loc["body", "limits", "max_steps"]["value"] == 100000
    assert by_loc["body", "sandbox", "cpus"]["limit"] == 4.0
    assert len(by_loc) == 2


async def test_validation_errors_do_not_echo_the_input(client: httpx.AsyncClient) -> None:
    secret = "x" * 5000
    response = await client.post("/v1/tasks", json={"prompt": 1, "llm": {"model": secret}})
    assert_error(response, 422, "invalid_input")
    assert secret not in response.text


async def test_invalid_json_is_422_in_the_contract_shape(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    response = await client.post(
        "/v1/tasks", content=b'{"prompt": ', headers={"content-type": "application/json"}
    )
    assert_error(response, 422, "invalid_input")
    assert await count_tasks(sessions) == 0


async def test_oversized_files_are_413_and_store_nothing(
    api_settings: Settings, sessions: Sessions, redis: Redis
) -> None:
    small = api_settings.model_copy(update={"max_input_file_bytes": 8})
    async with serve(create_app(small)) as client:
        payload = {"prompt": "p", "input_files": [{"path": "a", "content_base64": b64(b"x" * 9)}]}
        response = await client.post("/v1/tasks", json=payload)
    error = assert_error(response, 413, "too_large")
    assert error["details"][0]["loc"] == ["body", "input_files", 0, "content_base64"]
    assert await count_tasks(sessions) == 0
    assert await redis.xlen(keys.TASK_STREAM) == 0


async def test_an_idempotent_repeat_answers_200_with_the_first_task(
    client: httpx.AsyncClient, sessions: Sessions, redis: Redis
) -> None:
    headers = {"Idempotency-Key": "order-42"}
    first = await client.post("/v1/tasks", json={"prompt": "p"}, headers=headers)
    again = await client.post("/v1/tasks", json={"prompt": "p"}, headers=headers)
    other = await client.post("/v1/tasks", json={"prompt": "p"}, headers={"Idempotency-Key": "o"})

    assert (first.status_code, again.status_code, other.status_code) == (202, 200, 202)
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"]
    assert other.json()["id"] != first.json()["id"]
    assert await count_tasks(sessions) == 2
    assert await redis.xlen(keys.TASK_STREAM) == 2


async def test_an_unknown_task_is_404(client: httpx.AsyncClient) -> None:
    error = assert_error(await client.get("/v1/tasks/tsk_NOPE"), 404, "not_found")
    assert "tsk_NOPE" in error["message"]


async def test_another_tenants_task_is_404_everywhere(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    theirs = await insert_task(sessions, tenant="other")
    await insert_step(sessions, theirs, 1, 0)
    for path in ("", "/trajectory"):
        assert_error(await client.get(f"/v1/tasks/{theirs}{path}"), 404, "not_found")
    assert (await client.get("/v1/tasks")).json()["items"] == []


async def test_list_is_newest_first_and_pages_with_a_cursor(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    ids = await insert_tasks(sessions, 5)
    await insert_task(sessions, tenant="other")
    seen: list[str] = []
    cursor: str | None = None
    for expected_size in (2, 2, 1):
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await client.get("/v1/tasks", params=params)).json()
        assert len(page["items"]) == expected_size
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
    assert cursor is None
    assert seen == list(reversed(ids))


async def test_list_without_parameters_returns_up_to_20(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    ids = await insert_tasks(sessions, 21)
    page = (await client.get("/v1/tasks")).json()
    assert [item["id"] for item in page["items"]] == list(reversed(ids))[:20]
    assert page["next_cursor"] is not None


async def test_list_filters_by_status(client: httpx.AsyncClient, sessions: Sessions) -> None:
    await insert_tasks(sessions, 2, status="queued")
    done = await insert_tasks(sessions, 2, status="succeeded", finish_reason="submitted")
    page = (await client.get("/v1/tasks", params={"status": "succeeded"})).json()
    assert sorted(item["id"] for item in page["items"]) == sorted(done)
    assert {item["finish_reason"] for item in page["items"]} == {"submitted"}
    assert_error(await client.get("/v1/tasks", params={"status": "nope"}), 422, "invalid_input")


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 101}, {"cursor": "!!"}])
async def test_list_refuses_bad_parameters(
    client: httpx.AsyncClient, params: dict[str, Any]
) -> None:
    assert_error(await client.get("/v1/tasks", params=params), 422, "invalid_input")


async def test_trajectory_is_ordered_by_attempt_then_index(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    task_id = await insert_task(sessions, status="running", attempt=2)
    for attempt, index in [(2, 1), (1, 1), (2, 0), (1, 0), (1, 2)]:
        await insert_step(sessions, task_id, attempt, index)
    response = await client.get(f"/v1/tasks/{task_id}/trajectory")
    assert response.status_code == 200
    body = response.json()
    assert body["task_id"] == task_id
    order = [(s["attempt"], s["index"]) for s in body["steps"]]
    assert order == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1)]
    first = body["steps"][0]
    assert first["action"] == {"tool": "execute_bash", "arguments": {"command": "echo 0"}}
    assert (first["thought"], first["observation"], first["exit_code"]) == ("thought 1.0", "0\n", 0)
    assert (first["llm_ms"], first["tool_ms"], first["prompt_tokens"]) == (5, 7, 11)


async def test_an_empty_trajectory(client: httpx.AsyncClient, sessions: Sessions) -> None:
    task_id = await insert_task(sessions)
    assert (await client.get(f"/v1/tasks/{task_id}/trajectory")).json() == {
        "task_id": task_id,
        "steps": [],
    }
