"""The review findings of the running-task file routes, through the real API, a real worker
process and a real sandbox (docs/files.md): a task on a catalogue image, a draining
worker, a request that is not JSON, what a dead worker leaves in Redis, a full disk, a
planted `usercustomize`, and the bounded header of what the sandbox prints."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from app.bus import files as bus
from app.bus import keys, leases
from app.config import Settings
from app.db.engine import Sessions
from app.sandbox.task_files import FileRefused, _Reader
from app.scripted import ScriptedLLMServer
from app.scripted.script import Script, Turn
from app.services.admin import service as admin
from app.services.tasks import files as task_files
from tests.api.conftest import assert_error
from tests.files.conftest import ALICE, SETUP, running_with_files, submit, wait_for
from tests.support.zygote import AppProcess

CATALOGUE = """
[images.extra]
reference = "{reference}"
description = "The base image under another name: its tasks wait on their own stream"
"""


@pytest.fixture
def files_settings(files_settings: Settings, docker_image: str, tmp_path: Path) -> Settings:
    """The file tests' settings, with a catalogue image and small scratch dirs (a full disk
    is cheap to reach)."""
    catalogue = tmp_path / "images.toml"
    catalogue.write_text(CATALOGUE.format(reference=docker_image))
    return files_settings.model_copy(
        update={"sandbox_images_file": catalogue, "sandbox_scratch_mb": 16}
    )


async def holder_worker(redis: Redis, task_id: str) -> str:
    lease = await redis.get(keys.task_lease(task_id))
    assert lease is not None, "the task is running: its lease names its worker"
    return leases.worker_of(lease.decode())


async def reply_keys(redis: Redis) -> list[bytes]:
    return [key async for key in redis.scan_iter(match=f"{keys.PREFIX}:files:reply:*")]


def test_the_worker_is_the_first_field_of_any_holder() -> None:
    image_stream = keys.task_stream("extra")
    assert leases.worker_of(leases.holder_of("w-1", "5-0")) == "w-1"
    assert leases.worker_of(leases.holder_of("w-1", "5-0", image_stream)) == "w-1"


async def test_a_task_on_a_catalogue_image_has_its_files(
    api: httpx.AsyncClient, redis: Redis, worker: AppProcess, sleeper: str
) -> None:
    body = {
        "prompt": "keep running",
        "llm": {"model": sleeper},
        "sandbox": {"image": "extra"},
        "limits": {"timeout_s": 900, "command_timeout_s": 900},
    }
    created = await api.post("/v1/tasks", json=body, headers=ALICE)
    assert created.status_code == 202, created.text
    task_id = str(created.json()["id"])
    await running_with_files(api, task_id)
    lease = await redis.get(keys.task_lease(task_id))
    assert lease is not None
    assert keys.task_stream("extra").encode() in lease, lease
    read = await api.get(f"/v1/tasks/{task_id}/files/output/answer.txt", headers=ALICE)
    assert (read.status_code, read.content) == (200, b"hello files\n"), read.text


async def test_files_stay_reachable_while_the_worker_drains(
    api: httpx.AsyncClient,
    redis: Redis,
    worker: AppProcess,
    sleeper: str,
    tmp_path: Path,
) -> None:
    task_id = await submit(api, sleeper)
    await running_with_files(api, task_id)
    await admin.drain(redis, await holder_worker(redis, task_id))
    log = tmp_path / "worker.log"

    async def drained() -> bool:
        return "is drained by an operator" in log.read_text(errors="replace")

    await wait_for("the worker to see its drain", drained)
    read = await api.get(f"/v1/tasks/{task_id}/files/output/answer.txt", headers=ALICE)
    assert (read.status_code, read.content) == (200, b"hello files\n"), read.text
    assert worker.poll() is None, "still running its task"


async def test_a_request_that_is_not_json_is_dropped_and_the_service_goes_on(
    api: httpx.AsyncClient,
    redis: Redis,
    worker: AppProcess,
    sleeper: str,
    tmp_path: Path,
) -> None:
    task_id = await submit(api, sleeper)
    await running_with_files(api, task_id)
    name = await holder_worker(redis, task_id)
    await redis.rpush(bus.requests_of(name), b"{not json", b"\xff\xfe", b"[1, 2]")
    await wait_for("the worker to take them", lambda: _empty(redis, bus.requests_of(name)))
    read = await api.get(f"/v1/tasks/{task_id}/files/output/answer.txt", headers=ALICE)
    assert (read.status_code, read.content) == (200, b"hello files\n"), read.text
    logged = (tmp_path / "worker.log").read_text(errors="replace")
    assert "dropped a request that is not JSON" in logged
    assert "dropped a request that is not an object" in logged


async def _empty(redis: Redis, key: str) -> bool:
    return not await redis.llen(key)


async def test_a_dead_worker_leaves_no_request_and_no_reply_behind(
    api: httpx.AsyncClient, redis: Redis, worker: AppProcess, sleeper: str
) -> None:
    task_id = await submit(api, sleeper)
    await running_with_files(api, task_id)
    name = await holder_worker(redis, task_id)
    worker.kill()
    worker.wait()
    response = await api.get(f"/v1/tasks/{task_id}/files/output/answer.txt", headers=ALICE)
    assert_error(response, 503, "unavailable")
    assert await redis.llen(bus.requests_of(name)) == 0, "the request was taken back"
    assert await reply_keys(redis) == []


async def test_a_request_list_lives_no_longer_than_its_last_wait(redis: Redis) -> None:
    nobody = f"w-gone-{uuid.uuid4().hex[:6]}"
    sent = await bus.send(redis, nobody, {"op": "list", "path": ""}, timeout_s=5)
    assert 0 < await redis.ttl(bus.requests_of(nobody)) <= 5
    await bus.answer(redis, sent.reply, {"listing": {}})
    await bus.abandon(redis, sent)
    assert await redis.exists(bus.requests_of(nobody), sent.reply) == 0


@pytest.fixture
def filler(scripted_llm: ScriptedLLMServer) -> str:
    """A model that sets the files up, fills /run (a 16 MiB tmpfs here), then sleeps."""
    model = f"files-full-{uuid.uuid4().hex[:8]}"
    fill = "(head -c 32M /dev/zero > /run/fill 2>/dev/null || true)"
    turns = [
        Turn(tool="execute_bash", arguments={"command": f"{fill} && {SETUP}"}),
        Turn(tool="execute_bash", arguments={"command": "sleep 600"}),
        Turn(tool="submit"),
    ]
    scripted_llm.add_script(model, Script(turns=turns))
    return model


async def test_a_write_to_a_full_disk_is_507_and_writes_nothing(
    api: httpx.AsyncClient, worker: AppProcess, filler: str
) -> None:
    task_id = await submit(api, filler)
    await running_with_files(api, task_id)
    files = f"/v1/tasks/{task_id}/files"
    full = await api.put(f"{files}//run/more.bin", content=b"x" * 50_000, headers=ALICE)
    error = assert_error(full, 507, "insufficient_storage")
    assert "disk is full" in error["message"], error
    listed = (await api.get(files, params={"path": "/run"}, headers=ALICE)).json()["entries"]
    names = {entry["name"] for entry in listed}
    assert "fill" in names
    assert "more.bin" not in names
    assert not [name for name in names if name.startswith(".sandhive-put")], "nothing half written"


async def test_a_planted_usercustomize_does_not_run_in_file_requests(
    api: httpx.AsyncClient, worker: AppProcess, sleeper: str
) -> None:
    task_id = await submit(api, sleeper)
    await running_with_files(api, task_id)
    files = f"/v1/tasks/{task_id}/files"
    planted = b"open('/tmp/pwned', 'w').write('ran')\n"
    for minor in range(7, 15):  # whichever python3 the image has
        site = f"/root/.local/lib/python3.{minor}/site-packages"
        for name, content in (
            ("usercustomize.py", planted),
            ("evil.pth", b"import usercustomize\n"),
        ):
            put = await api.put(f"{files}/{site}/{name}", content=content, headers=ALICE)
            assert put.status_code == 200, put.text
    listed = (await api.get(files, params={"path": "/tmp"}, headers=ALICE)).json()["entries"]
    assert "pwned" not in {entry["name"] for entry in listed}


async def test_the_header_is_capped_and_found_across_many_pieces() -> None:
    reader = _Reader(None, None, max_header=1000)
    for piece in (b'{"path": "/x", ', b'"entries": []', b', "truncated": false}', b"\n"):
        await reader.feed("stdout", piece)
    assert reader.result()["path"] == "/x"

    flood = _Reader(None, None, max_header=1000)
    for _ in range(20):
        await flood.feed("stdout", b" " * 100)
    with pytest.raises(FileRefused) as refused:
        flood.result()
    assert refused.value.kind == "failure"
    late = _Reader(None, None, max_header=1000)
    await late.feed("stdout", b" " * 1500 + b'{"path": "/x"}\n')
    with pytest.raises(FileRefused):
        late.result()


async def test_a_reader_that_goes_away_part_way_leaves_no_reply_behind(
    api: httpx.AsyncClient,
    redis: Redis,
    sessions: Sessions,
    files_settings: Settings,
    worker: AppProcess,
    sleeper: str,
) -> None:
    """What the API does when its client hangs up mid-read: the chunk generator is closed."""
    task_id = await submit(api, sleeper)
    await running_with_files(api, task_id)
    opened = await task_files.read_file(
        sessions, redis, files_settings, "alice", task_id, "output/mid.bin"
    )
    assert opened.size == 150_000
    first = await anext(opened.chunks)
    assert 0 < len(first) < opened.size, "more chunks to come"

    async def all_sent() -> bool:
        found = await reply_keys(redis)  # the other chunks and the end, unread
        last = await redis.lindex(found[0], -1) if len(found) == 1 else None
        return last is not None and "end" in json.loads(last)

    await wait_for("the worker to send the rest", all_sent)
    await opened.chunks.aclose()
    assert await reply_keys(redis) == []
