"""A sandbox's life beyond its commands: who may make one, its deadline, its worker's death,
streamed output, users, and the metrics that show it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

from app.api.app import create_app
from app.config import Settings
from app.sandbox import DockerHost
from app.sandbox.policy import SANDBOX_LABEL
from tests.api.conftest import serve
from tests.api.live_server import live_server
from tests.sandboxes.conftest import ALICE, create, run
from tests.support.experiments import as_tenant
from tests.support.processes import free_port, ready_worker
from tests.support.zygote import AppProcess


async def containers_of(sandbox_id: str) -> list[str]:
    async with DockerHost() as docker:
        return await docker.list_sandboxes({SANDBOX_LABEL: sandbox_id})


async def wait_until(check: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():  # type: ignore[misc]
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.2)


async def test_a_writable_image_filesystem_only_where_the_operator_allows_it(
    make_sandbox_settings: Callable[..., Settings],
    tmp_path: Path,
    worker: AppProcess,
    api: httpx.AsyncClient,
) -> None:
    refused = await api.post("/v1/sandboxes", json={"read_only_rootfs": False}, headers=ALICE)
    assert refused.status_code == 422, refused.text
    assert "SANDHIVE_SANDBOX_ALLOW_WRITABLE_ROOTFS" in refused.json()["error"]["message"]

    settings = make_sandbox_settings(sandbox_allow_writable_rootfs=True)
    async with serve(create_app(settings)) as allowing:
        allowing.timeout = httpx.Timeout(120.0)
        made = await create(allowing, read_only_rootfs=False)
        sid = made["id"]
        added = await run(allowing, sid, argv=["useradd", "-m", "alice"])
        assert added["exit_code"] == 0, added
        done = await run(allowing, sid, command="whoami; echo $HOME", user="alice")
        assert done["stdout"] == "alice\n/home/alice\n"
        assert (await run(allowing, sid, argv=["whoami"]))["stdout"] == "root\n"
        missing = await run(allowing, sid, argv=["whoami"], user="nobody-here")
        assert missing["exit_code"] == 126
        assert "nobody-here" in missing["stderr"]
        denied = await run(allowing, sid, argv=["/etc/passwd"])
        assert denied["exit_code"] == 126
        assert "Permission denied" in denied["stderr"]


async def test_output_streams_as_the_command_prints(
    sandbox_settings: Settings, api: httpx.AsyncClient, worker: AppProcess
) -> None:
    """Over a real uvicorn (httpx's in-process transport buffers a whole response)."""
    sid = (await create(api))["id"]
    async with (
        live_server(sandbox_settings) as live,
        httpx.AsyncClient(base_url=live.base_url, timeout=60) as http,
    ):
        await _stream(http, sid, api)


async def _stream(http: httpx.AsyncClient, sid: str, api: httpx.AsyncClient) -> None:
    body = {"command": "echo first; sleep 2; echo second >&2; exit 4"}
    events: list[tuple[str, dict[str, object], float]] = []
    async with http.stream(
        "POST", f"/v1/sandboxes/{sid}/exec/stream", json=body, headers=ALICE
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        name = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: ")), time.monotonic()))
    assert [(n, d.get("stream"), d.get("data")) for n, d, _ in events[:2]] == [
        ("output", "stdout", "first\n"),
        ("output", "stderr", "second\n"),
    ]
    gap = events[1][2] - events[0][2]
    assert gap > 1.0, "the first line came only with the second, after the sleep"
    name, result, _ = events[-1]
    assert name == "exit"
    assert result["exit_code"] == 4
    assert result["stdout"] == ""
    log = (await api.get(f"/v1/sandboxes/{sid}/commands", headers=ALICE)).json()["items"]
    assert log[-1]["command"] == body["command"]


async def test_a_sandbox_goes_at_its_deadline_and_an_extension_moves_it(
    api: httpx.AsyncClient, worker: AppProcess
) -> None:
    short = (await create(api, ttl_s=2))["id"]
    kept = (await create(api, ttl_s=60))["id"]
    for ttl_s in (2, 60):  # shortened, then extended again: the worker reads the row
        moved = await api.post(f"/v1/sandboxes/{kept}/ttl", json={"ttl_s": ttl_s}, headers=ALICE)
        assert moved.status_code == 200, moved.text
    too_long = await api.post(f"/v1/sandboxes/{kept}/ttl", json={"ttl_s": 10**6}, headers=ALICE)
    assert too_long.status_code == 422

    async def expired() -> bool:
        got = (await api.get(f"/v1/sandboxes/{short}", headers=ALICE)).json()
        return got["status"] == "ended"

    await wait_until(expired, "the short sandbox expired", 30)
    got = (await api.get(f"/v1/sandboxes/{short}", headers=ALICE)).json()
    assert got["end_reason"] == "expired"
    await asyncio.sleep(1)  # its container goes right after its row ends
    assert await containers_of(short) == []
    assert (await run(api, kept, argv=["true"]))["exit_code"] == 0
    late = await api.post(f"/v1/sandboxes/{short}/exec", json={"argv": ["true"]}, headers=ALICE)
    assert late.status_code == 409
    assert late.json()["error"]["details"]["end_reason"] == "expired"


async def test_a_tenant_has_a_cap_on_sandboxes(
    make_sandbox_settings: Callable[..., Settings], worker: AppProcess
) -> None:
    settings = make_sandbox_settings(tenant_max_sandboxes=1)
    async with serve(create_app(settings)) as api:
        api.timeout = httpx.Timeout(120.0)
        carol = as_tenant(f"carol-{uuid.uuid4().hex[:8]}")  # a tenant with no sandbox yet
        first = await api.post("/v1/sandboxes", json={}, headers=carol)
        assert first.status_code == 201, first.text
        second = await api.post("/v1/sandboxes", json={}, headers=carol)
        assert second.status_code == 429
        assert "Retry-After" in second.headers
        await api.delete(f"/v1/sandboxes/{first.json()['id']}", headers=carol)
        third = await api.post("/v1/sandboxes", json={}, headers=carol)
        assert third.status_code == 201, third.text


async def test_a_dead_workers_sandbox_answers_at_once_and_is_removed(
    sandbox_settings: Settings, api: httpx.AsyncClient, tmp_path: Path
) -> None:
    """SIGKILL the worker holding a sandbox: a command answers 503 (not a hang), the row
    says `worker_lost`, and another worker's reaper removes the container."""
    with ready_worker(sandbox_settings, tmp_path / "first.log") as first:
        sid = (await create(api))["id"]
        assert await containers_of(sid)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    started = time.monotonic()
    lost = await api.post(f"/v1/sandboxes/{sid}/exec", json={"argv": ["true"]}, headers=ALICE)
    assert lost.status_code == 503, lost.text
    assert time.monotonic() - started < 30
    assert "lost" in lost.json()["error"]["message"]
    row = (await api.get(f"/v1/sandboxes/{sid}", headers=ALICE)).json()
    assert (row["status"], row["end_reason"]) == ("ended", "worker_lost")
    with ready_worker(sandbox_settings, tmp_path / "second.log"):

        async def removed() -> bool:
            return not await containers_of(sid)

        await wait_until(removed, "the reaper removed the dead worker's sandbox", 30)


async def test_metrics_count_sandboxes_and_commands(
    make_sandbox_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    port = free_port()
    settings = make_sandbox_settings(worker_metrics_port=port)
    with ready_worker(settings, tmp_path / "worker.log"):
        async with serve(create_app(settings)) as api:
            api.timeout = httpx.Timeout(120.0)
            sid = (await create(api))["id"]
            await run(api, sid, argv=["true"])
            async with httpx.AsyncClient() as plain:
                text = (await plain.get(f"http://127.0.0.1:{port}/metrics")).text
            assert "sandhive_worker_api_sandboxes 1.0" in text
            assert "sandhive_worker_api_sandbox_commands_total 1.0" in text


async def test_a_stream_whose_worker_dies_ends_with_an_error_event(
    sandbox_settings: Settings, api: httpx.AsyncClient, tmp_path: Path
) -> None:
    with ready_worker(sandbox_settings, tmp_path / "worker.log") as holder:
        sid = (await create(api))["id"]
        async with (
            live_server(sandbox_settings) as live,
            httpx.AsyncClient(base_url=live.base_url, timeout=60) as http,
            http.stream(
                "POST",
                f"/v1/sandboxes/{sid}/exec/stream",
                json={"command": "echo up; sleep 60"},
                headers=ALICE,
            ) as response,
        ):
            assert response.status_code == 200
            events = []
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line.removeprefix("data: ")))
                    if len(events) == 1:  # the output is flowing: kill its worker
                        os.kill(holder.pid, signal.SIGKILL)
    assert events[0] == {"stream": "stdout", "data": "up\n"}
    assert events[-1]["code"] == "unavailable"
    assert "lost" in events[-1]["message"]


async def test_streamed_commands_hold_the_tenants_stream_slots(
    make_sandbox_settings: Callable[..., Settings], worker: AppProcess, api: httpx.AsyncClient
) -> None:
    """A streamed command is an open stream like any other: past the tenant's
    `SANDHIVE_STREAM_MAX_PER_TENANT` the next is refused at once (429), nothing sent."""
    sid = (await create(api))["id"]
    settings = make_sandbox_settings(stream_max_per_tenant=1)
    async with (
        live_server(settings) as live,
        httpx.AsyncClient(base_url=live.base_url, timeout=60) as http,
    ):
        url = f"/v1/sandboxes/{sid}/exec/stream"
        # Long enough that the first stream is surely still open when the second asks; it
        # is cut when the client leaves, and the sandbox removed at the end.
        async with http.stream(
            "POST", url, json={"command": "echo held; sleep 60"}, headers=ALICE
        ) as first:
            assert first.status_code == 200
            # Held in a name until the end: a line iterator left by `break` is finalized
            # at once, and closing it closes the connection, which ends the stream and
            # frees its slot while the second request is on its way (a flaky CI run).
            lines = first.aiter_lines()
            async for line in lines:
                if line.startswith("data: "):
                    break  # the first stream is running
            second = await http.post(url, json={"argv": ["true"]}, headers=ALICE)
            assert second.status_code == 429, second.text
            assert "Retry-After" in second.headers
            await lines.aclose()
        log = (await api.get(f"/v1/sandboxes/{sid}/commands", headers=ALICE)).json()["items"]
        assert [entry["command"] for entry in log] == ["echo held; sleep 60"], "nothing sent"
