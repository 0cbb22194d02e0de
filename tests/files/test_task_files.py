"""`/v1/tasks/{id}/files` through the real API, a real worker process and a real sandbox
(docs/files.md): listing, streamed reads, writes, the caps, bad paths, links the hostile
agent planted, tenant isolation, a finished task, a dead worker."""

from __future__ import annotations

import hashlib

import httpx

from app.db.engine import Sessions
from tests.api.conftest import assert_error
from tests.files.conftest import ALICE, BOB, running_with_files, submit, wait_for
from tests.support.rows import insert_task
from tests.support.zygote import AppProcess


async def test_list_read_and_write_while_the_task_runs(
    api: httpx.AsyncClient, worker: AppProcess, sleeper: str
) -> None:
    task_id = await submit(api, sleeper)
    await running_with_files(api, task_id)
    files = f"/v1/tasks/{task_id}/files"

    listing = await api.get(files, headers=ALICE)
    assert listing.status_code == 200, listing.text
    body = listing.json()
    assert body["path"] == "/testbed"
    kinds = {entry["name"]: entry["type"] for entry in body["entries"]}
    assert (kinds["output"], kinds["esc"], kinds["input"]) == ("dir", "symlink", "dir")
    output = (await api.get(files, params={"path": "output"}, headers=ALICE)).json()
    sizes = {entry["name"]: (entry["type"], entry["size"]) for entry in output["entries"]}
    assert sizes["answer.txt"] == ("file", 12)
    assert (sizes["fifo"][0], sizes["passwd"][0]) == ("other", "symlink")
    assert [e["name"] for e in output["entries"]] == sorted(sizes), "sorted by name"

    read = await api.get(f"{files}/output/answer.txt", headers=ALICE)
    assert read.status_code == 200, read.text
    assert read.content == b"hello files\n"
    assert read.headers["content-type"] == "application/octet-stream"
    assert read.headers["x-content-type-options"] == "nosniff"
    assert read.headers["content-length"] == "12"
    inside = await api.get(f"{files}//tmp/inside", headers=ALICE)
    assert inside.content == b"hello files\n", "a link that stays in the area is followed"

    written = await api.put(f"{files}/input/new/data.csv", content=b"a,b\n1,2\n", headers=ALICE)
    assert written.status_code == 200, written.text
    assert written.json() == {"path": "/testbed/input/new/data.csv", "size": 8}
    again = await api.get(f"{files}/input/new/data.csv", headers=ALICE)
    assert again.content == b"a,b\n1,2\n"
    empty = await api.put(f"{files}//tmp/empty", content=b"", headers=ALICE)
    assert empty.json()["size"] == 0
    assert (await api.get(f"{files}//tmp/empty", headers=ALICE)).content == b""

    # Within the cap, streamed in many chunks; over it, 413 before a byte is sent.
    mid = await api.get(f"{files}/output/mid.bin", headers=ALICE)
    assert len(mid.content) == 150_000
    sha = (await api.get(f"{files}/output/mid.sha", headers=ALICE)).content.split()[0]
    assert hashlib.sha256(mid.content).hexdigest().encode() == sha
    assert_error(await api.get(f"{files}/output/big.bin", headers=ALICE), 413, "too_large")
    assert_error(
        await api.put(f"{files}/x.bin", content=b"x" * 100_001, headers=ALICE), 413, "too_large"
    )
    listed = (await api.get(files, headers=ALICE)).json()["entries"]
    assert "x.bin" not in {entry["name"] for entry in listed}, "nothing half written"
    assert_error(await api.get(f"{files}/output/nope.txt", headers=ALICE), 404, "not_found")
    assert_error(await api.get(f"{files}/output/fifo", headers=ALICE), 422, "invalid_input")
    assert_error(await api.get(f"{files}/output", headers=ALICE), 422, "invalid_input")


async def test_paths_that_leave_the_writable_area_are_refused(
    api: httpx.AsyncClient, worker: AppProcess, sleeper: str
) -> None:
    task_id = await submit(api, sleeper)
    await running_with_files(api, task_id)
    files = f"/v1/tasks/{task_id}/files"

    for path in ("esc/passwd", "output/passwd", "/etc/passwd", "/proc/1/environ", "/usr/bin"):
        error = assert_error(await api.get(f"{files}/{path}", headers=ALICE), 422, "invalid_input")
        assert "outside the sandbox's writable area" in error["message"], error
    error = assert_error(
        await api.get(files, params={"path": "esc"}, headers=ALICE), 422, "invalid_input"
    )
    assert "resolves to /etc" in error["message"]
    for path in ("esc/evil", "output/passwd", "/etc/cron.d/evil"):
        refused = await api.put(f"{files}/{path}", content=b"owned", headers=ALICE)
        assert_error(refused, 422, "invalid_input")
    # Percent-encoded: httpx would drop the dots itself (a server gets them from others).
    for bad in ("%2E%2E/etc/passwd", "output/%2E%2E/%2E%2E/etc/passwd", "a%01b"):
        assert_error(await api.get(f"{files}/{bad}", headers=ALICE), 422, "invalid_input")
    assert_error(
        await api.get(files, params={"path": "../.."}, headers=ALICE), 422, "invalid_input"
    )
    # The link still points out, and /etc gained nothing: read back through a shell command.
    etc = await api.get(files, params={"path": "/tmp"}, headers=ALICE)
    assert "evil" not in {entry["name"] for entry in etc.json()["entries"]}


async def test_other_tenants_get_404_and_ended_tasks_409(
    api: httpx.AsyncClient, worker: AppProcess, sleeper: str
) -> None:
    task_id = await submit(api, sleeper)
    await running_with_files(api, task_id)
    files = f"/v1/tasks/{task_id}/files"
    assert_error(await api.get(files, headers=BOB), 404, "not_found")
    assert_error(await api.get(f"{files}/output/answer.txt", headers=BOB), 404, "not_found")
    assert_error(await api.put(f"{files}/evil", content=b"x", headers=BOB), 404, "not_found")
    assert_error(await api.get("/v1/tasks/tsk_nope/files", headers=ALICE), 404, "not_found")
    assert "evil" not in {
        e["name"] for e in (await api.get(files, headers=ALICE)).json()["entries"]
    }

    cancelled = await api.post(f"/v1/tasks/{task_id}/cancel", headers=ALICE)
    assert cancelled.status_code == 202, cancelled.text

    async def ended() -> bool:
        task = (await api.get(f"/v1/tasks/{task_id}", headers=ALICE)).json()
        return bool(task["status"] == "cancelled")

    await wait_for("the cancel", ended)
    error = assert_error(await api.get(files, headers=ALICE), 409, "conflict")
    assert f"/v1/tasks/{task_id}/artifacts" in error["message"], "says what to use instead"
    assert error["details"]["status"] == "cancelled"
    assert_error(await api.put(f"{files}/late", content=b"x", headers=ALICE), 409, "conflict")


async def test_a_dead_worker_is_a_503(
    api: httpx.AsyncClient, worker: AppProcess, sleeper: str
) -> None:
    task_id = await submit(api, sleeper)
    await running_with_files(api, task_id)
    worker.kill()
    worker.wait()
    response = await api.get(f"/v1/tasks/{task_id}/files/output/answer.txt", headers=ALICE)
    error = assert_error(response, 503, "unavailable")
    assert "retry" in error["message"]
    assert response.headers["retry-after"]


async def test_a_worker_that_does_not_answer_in_time_is_a_504(
    api: httpx.AsyncClient, worker: AppProcess, freezer: str
) -> None:
    task_id = await submit(api, freezer)
    seen: list[int] = []

    async def frozen() -> httpx.Response | None:
        # 409 (queued), 503 (sandbox starting), 200: until the agent has stopped the channel.
        response = await api.get(f"/v1/tasks/{task_id}/files", headers=ALICE)
        seen.append(response.status_code)
        return response if response.status_code == 504 else None

    response = await wait_for("the sandbox to stop answering", frozen, why=lambda: seen)
    error = assert_error(response, 504, "worker_timeout")
    assert "did not answer within 5 s" in error["message"] or "took over 5 s" in error["message"]
    assert worker.poll() is None, "the worker itself is fine"


async def test_a_queued_task_is_409_and_a_running_one_nobody_holds_503(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    """No worker at all: what the task row and its (missing) lease say is enough."""
    queued = await insert_task(sessions, tenant="alice")
    error = assert_error(await api.get(f"/v1/tasks/{queued}/files", headers=ALICE), 409, "conflict")
    assert "once it runs" in error["message"]
    held_by_nobody = await insert_task(sessions, tenant="alice", status="running", attempt=1)
    response = await api.get(f"/v1/tasks/{held_by_nobody}/files/a.txt", headers=ALICE)
    assert "no worker holds" in assert_error(response, 503, "unavailable")["message"]
    assert_error(await api.get(f"/v1/tasks/{queued}/files", headers=BOB), 404, "not_found")
    unknown = await api.get(f"/v1/tasks/{queued}/files", params={"x": "1"}, headers=ALICE)
    assert_error(unknown, 422, "invalid_input")
