"""services.tasks: resolving a submission, checking its inputs, storing and enqueuing it."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import asyncpg
import pytest
from pydantic import SecretStr
from redis.asyncio import Redis
from sqlalchemy import func, select

from app.bus import keys
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.domain import resolve
from app.errors import InvalidInput, NotFound, TooLarge
from app.schemas.tasks import TaskCreate
from app.services.tasks import service as tasks
from tests.support.settings import plain_settings

B64 = base64.b64encode


def body(**fields: object) -> TaskCreate:
    return TaskCreate.model_validate({"prompt": "compute", **fields})


def files(*items: tuple[str, bytes]) -> list[dict[str, str]]:
    return [{"path": p, "content_base64": B64(c).decode()} for p, c in items]


# resolve_spec


def test_resolve_fills_every_default_from_settings() -> None:
    settings = plain_settings("postgresql+asyncpg://unused/x")
    spec = resolve.resolve_spec(body(), settings)
    assert spec.llm.profile == "default"
    assert spec.llm.model == "test-model"
    assert spec.llm.temperature == settings.default_temperature
    assert spec.llm.max_tokens_per_call == settings.default_max_tokens_per_call
    assert spec.limits.max_steps == settings.default_max_steps
    assert spec.limits.timeout_s == settings.default_timeout_s
    assert spec.limits.command_timeout_s == settings.default_command_timeout_s
    assert spec.limits.max_context_tokens == settings.default_max_context_tokens
    assert spec.sandbox.image == "sandhive-sandbox:test"
    assert (spec.sandbox.cpus, spec.sandbox.memory_mb) == (1.0, 1024)
    assert spec.sandbox.network == "none"
    assert spec.tools.profile == "standard"


def test_resolve_keeps_values_within_the_maxima() -> None:
    settings = plain_settings("postgresql+asyncpg://unused/x")
    spec = resolve.resolve_spec(
        body(
            llm={"model": "other", "temperature": 0.2, "max_tokens_per_call": 77},
            limits={"max_steps": 500, "timeout_s": 10, "command_timeout_s": 5},
            sandbox={"cpus": 4.0, "memory_mb": 8192},
            tools={"profile": "reference"},
        ),
        settings,
    )
    assert (spec.llm.model, spec.llm.temperature, spec.llm.max_tokens_per_call) == (
        "other",
        0.2,
        77,
    )
    assert (spec.limits.max_steps, spec.limits.timeout_s, spec.limits.command_timeout_s) == (
        500,
        10,
        5,
    )
    assert (spec.sandbox.cpus, spec.sandbox.memory_mb) == (4.0, 8192)
    assert spec.tools.profile == "reference"


def test_resolve_lists_every_violated_maximum() -> None:
    settings = plain_settings("postgresql+asyncpg://unused/x")
    over = body(
        llm={"max_tokens_per_call": 10**7},
        limits={
            "max_steps": 100000,
            "timeout_s": 10**6,
            "command_timeout_s": 10**6,
            "max_context_tokens": 10**8,
        },
        sandbox={"cpus": 64, "memory_mb": 10**6},
    )
    with pytest.raises(InvalidInput) as caught:
        resolve.resolve_spec(over, settings)
    details = caught.value.details
    assert isinstance(details, list)
    by_loc = {tuple(d["loc"]): d for d in details}
    assert set(by_loc) == {
        ("body", "llm", "max_tokens_per_call"),
        ("body", "limits", "max_steps"),
        ("body", "limits", "timeout_s"),
        ("body", "limits", "command_timeout_s"),
        ("body", "limits", "max_context_tokens"),
        ("body", "sandbox", "cpus"),
        ("body", "sandbox", "memory_mb"),
    }
    assert by_loc["body", "limits", "max_steps"]["limit"] == settings.max_max_steps
    assert by_loc["body", "limits", "max_steps"]["value"] == 100000
    assert by_loc["body", "sandbox", "cpus"]["limit"] == settings.max_cpus


@pytest.mark.parametrize(
    ("fields", "loc", "message"),
    [
        ({"llm": {"profile": "nope"}}, "profile", "unknown llm profile 'nope'"),
        ({"sandbox": {"network": "egress"}}, "network", "egress is not enabled on this server"),
        ({"sandbox": {"image": "ubuntu"}}, "image", "'ubuntu' is not available; available: def"),
    ],
)
def test_resolve_refuses_what_the_server_cannot_serve(
    fields: dict[str, object], loc: str, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message) as caught:
        resolve.resolve_spec(body(**fields), plain_settings("postgresql+asyncpg://unused/x"))
    assert isinstance(caught.value.details, list)
    assert caught.value.details[0]["loc"][-1] == loc


def test_resolve_needs_a_model_from_the_task_or_the_profile() -> None:
    settings = plain_settings("postgresql+asyncpg://unused/x", llm_model="")
    with pytest.raises(InvalidInput, match="no model"):
        resolve.resolve_spec(body(), settings)
    assert resolve.resolve_spec(body(llm={"model": "given"}), settings).llm.model == "given"


def test_resolve_uses_named_profiles_from_the_file(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles.toml"
    profiles.write_text('[profiles.big]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "big-model"\n')
    settings = plain_settings("postgresql+asyncpg://unused/x", llm_profiles_file=profiles)
    spec = resolve.resolve_spec(body(llm={"profile": "big"}), settings)
    assert (spec.llm.profile, spec.llm.model) == ("big", "big-model")
    assert isinstance(settings.llm_profiles()["big"].api_key, SecretStr)


# check_inputs


@pytest.mark.parametrize("path", ["a.txt", "data/table.csv", "deep/er/x.bin", "..hidden", "a b"])
def test_check_accepts_relative_paths(path: str) -> None:
    settings = plain_settings("postgresql+asyncpg://unused/x")
    assert resolve.check_inputs(body(input_files=files((path, b"x"))), settings) == [(path, b"x")]


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../x", "a/../../b", "a//b", "a/", ".", "./a", "a/./b"]
)  # NUL never gets this far: the schema refuses it (tests/security/test_schemas.py)
def test_check_refuses_unsafe_paths(path: str) -> None:
    settings = plain_settings("postgresql+asyncpg://unused/x")
    with pytest.raises(InvalidInput) as caught:
        resolve.check_inputs(body(input_files=files((path, b"x"))), settings)
    assert isinstance(caught.value.details, list)
    assert caught.value.details[0]["loc"] == ["body", "input_files", 0, "path"]


def test_check_refuses_a_path_longer_than_1024() -> None:
    # The schema caps the length too; the service holds the rule on its own.
    item = {"path": "a" * 1024, "content_base64": ""}
    data = body(input_files=[item])
    data.input_files[0].path = "a" * 1025
    with pytest.raises(InvalidInput, match="1024"):
        resolve.check_inputs(data, plain_settings("postgresql+asyncpg://unused/x"))


def test_check_decodes_base64_and_tolerates_line_breaks() -> None:
    content = bytes(range(256)) * 4
    wrapped = "\n".join(B64(content).decode()[i : i + 76] for i in range(0, len(B64(content)), 76))
    data = body(input_files=[{"path": "blob.bin", "content_base64": wrapped}])
    settings = plain_settings("postgresql+asyncpg://unused/x")
    assert resolve.check_inputs(data, settings) == [("blob.bin", content)]


@pytest.mark.parametrize("text", ["not base64!", "abc", "YQ==YQ=="])
def test_check_refuses_bad_base64(text: str) -> None:
    data = body(input_files=[{"path": "a", "content_base64": text}])
    with pytest.raises(InvalidInput, match="base64"):
        resolve.check_inputs(data, plain_settings("postgresql+asyncpg://unused/x"))


def test_check_refuses_duplicate_paths() -> None:
    data = body(input_files=files(("a", b"1"), ("a", b"2")))
    with pytest.raises(InvalidInput, match="duplicate"):
        resolve.check_inputs(data, plain_settings("postgresql+asyncpg://unused/x"))


def test_check_enforces_counts_and_sizes() -> None:
    settings = plain_settings(
        "postgresql+asyncpg://unused/x",
        max_input_files=2,
        max_input_file_bytes=10,
        max_input_total_bytes=15,
        max_prompt_chars=20,
        max_metadata_bytes=20,
    )
    with pytest.raises(InvalidInput, match="more than 2 files"):
        resolve.check_inputs(body(input_files=files(("a", b""), ("b", b""), ("c", b""))), settings)
    with pytest.raises(TooLarge, match="larger than 10 bytes"):
        resolve.check_inputs(body(input_files=files(("a", b"x" * 11))), settings)
    with pytest.raises(TooLarge, match="larger than 10 bytes"):
        resolve.check_inputs(body(input_files=files(("a", b"x" * 1000))), settings)
    with pytest.raises(TooLarge, match="15 bytes in total"):
        resolve.check_inputs(body(input_files=files(("a", b"x" * 8), ("b", b"x" * 8))), settings)
    with pytest.raises(InvalidInput, match="prompt"):
        resolve.check_inputs(body(prompt="p" * 21), settings)
    with pytest.raises(InvalidInput, match="metadata"):
        resolve.check_inputs(body(metadata={"k": "v" * 20}), settings)
    exact = body(prompt="p" * 20, input_files=files(("a", b"x" * 10), ("b", b"x" * 5)))
    assert len(resolve.check_inputs(exact, settings)) == 2


# submit_task and reads


async def test_submit_stores_task_inputs_and_queued_event_then_enqueues(
    sessions: Sessions, redis: Redis, service_settings: Settings
) -> None:
    data = body(input_files=files(("in/a.txt", b"hello")), metadata={"k": [1, 2]})
    task, created = await tasks.submit_task(
        sessions, redis, service_settings, "t1", data, idempotency_key=None
    )
    assert created
    assert (task.status, task.attempt, task.metadata) == ("queued", 0, {"k": [1, 2]})
    async with sessions() as session:
        row = await session.get(models.Task, task.id)
        blobs = (await session.scalars(select(models.InputBlob))).all()
        events = (await session.scalars(select(models.Event))).all()
    assert row is not None
    assert (row.tenant_id, row.last_seq, row.idempotency_key) == ("t1", 1, None)
    assert [(b.task_id, b.path, b.content) for b in blobs] == [(task.id, "in/a.txt", b"hello")]
    assert [(e.task_id, e.seq, e.type) for e in events] == [(task.id, 1, "task.queued")]
    messages = await redis.xrange(keys.TASK_STREAM)
    assert [m[1] for m in messages] == [{b"task_id": task.id.encode()}]


async def test_submit_commits_the_row_before_the_message_exists(
    sessions: Sessions, redis: Redis, service_settings: Settings, clean_db: str
) -> None:
    """A worker that wakes on the message always finds the row (invariant 1)."""

    async def first_reader() -> bool:
        reader_redis = Redis.from_url(service_settings.redis_url)  # its own blocked connection
        conn = await asyncpg.connect(clean_db.replace("+asyncpg", ""))
        try:
            # From the stream's start, so a late reader still sees the message (no race).
            reply = await reader_redis.xread({keys.TASK_STREAM: "0-0"}, count=1, block=5_000)
            task_id = reply[0][1][0][1][b"task_id"].decode()
            return await conn.fetchval("SELECT count(*) FROM tasks WHERE id = $1", task_id) == 1
        finally:
            await conn.close()
            await reader_redis.aclose()

    reader = asyncio.create_task(first_reader())
    await asyncio.sleep(0.1)  # usually blocked on XREAD by now: it reads the message at once
    await tasks.submit_task(sessions, redis, service_settings, "t", body(), None)
    assert await reader


async def test_nothing_is_stored_or_enqueued_for_a_refused_task(
    sessions: Sessions, redis: Redis, service_settings: Settings
) -> None:
    with pytest.raises(InvalidInput):
        await tasks.submit_task(
            sessions, redis, service_settings, "t", body(limits={"max_steps": 10**6}), None
        )
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(models.Task)) == 0
    assert await redis.xlen(keys.TASK_STREAM) == 0


async def test_concurrent_repeats_of_one_idempotency_key_make_one_task(
    sessions: Sessions, redis: Redis, service_settings: Settings
) -> None:
    results = await asyncio.gather(
        *(
            tasks.submit_task(sessions, redis, service_settings, "t", body(), "key-1")
            for _ in range(6)
        )
    )
    assert len({task.id for task, _ in results}) == 1
    assert sorted(created for _, created in results) == [False] * 5 + [True]
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(models.Task)) == 1
    assert await redis.xlen(keys.TASK_STREAM) == 1


async def test_idempotency_keys_belong_to_their_tenant(
    sessions: Sessions, redis: Redis, service_settings: Settings
) -> None:
    first, _ = await tasks.submit_task(sessions, redis, service_settings, "a", body(), "k")
    second, created = await tasks.submit_task(sessions, redis, service_settings, "b", body(), "k")
    assert created
    assert first.id != second.id


async def test_reads_are_scoped_to_the_tenant(
    sessions: Sessions, redis: Redis, service_settings: Settings
) -> None:
    task, _ = await tasks.submit_task(sessions, redis, service_settings, "a", body(), None)
    assert (await tasks.get_task(sessions, "a", task.id)).id == task.id
    with pytest.raises(NotFound):
        await tasks.get_task(sessions, "b", task.id)
    with pytest.raises(NotFound):
        await tasks.get_trajectory(sessions, "b", task.id)
    assert (await tasks.list_tasks(sessions, "b")).items == []


@pytest.mark.parametrize(
    "cursor",
    [
        "!!!",
        "bm90IGpzb24",
        "WyJ4Il0",
        "WyJub3QgYSBkYXRlIiwgIngiXQ",
        "WyIyMDI2LTAxLTAxVDAwOjAwOjAwIiwgIngiXQ",
    ],
)
async def test_list_refuses_a_bad_cursor(sessions: Sessions, cursor: str) -> None:
    with pytest.raises(InvalidInput, match="cursor"):
        await tasks.list_tasks(sessions, "t", cursor=cursor)


@pytest.mark.parametrize("limit", [0, 101])
async def test_list_refuses_a_limit_out_of_range(sessions: Sessions, limit: int) -> None:
    with pytest.raises(InvalidInput, match="limit"):
        await tasks.list_tasks(sessions, "t", limit=limit)
