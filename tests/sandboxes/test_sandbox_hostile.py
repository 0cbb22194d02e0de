"""Hostile callers of `/v1/sandboxes`: what runs in a sandbox is hostile, and so may be what a
caller asks of it. The service stays responsive, and the sandbox sees only itself."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from tests.sandboxes.conftest import ALICE, create, run
from tests.support.zygote import AppProcess


async def test_bombs_floods_and_endless_commands_leave_the_service_responsive(
    api: httpx.AsyncClient, worker: AppProcess
) -> None:
    hostile = (await create(api, memory_mb=256))["id"]
    calm = (await create(api))["id"]
    attacks = [
        run(api, hostile, command=":(){ :|:& };:", timeout_s=5),  # fork bomb
        run(api, hostile, command="python3 -c 'b = []\nwhile True: b.append(bytearray(2**24))'"),
        run(api, hostile, argv=["yes"], timeout_s=3),  # floods stdout
        run(api, hostile, argv=["sleep", "infinity"], timeout_s=2),
    ]
    running = asyncio.gather(*attacks)
    await asyncio.sleep(1)
    started = time.monotonic()
    done = await run(api, calm, argv=["echo", "still here"])
    assert done["stdout"] == "still here\n"
    assert time.monotonic() - started < 20, "a calm sandbox waited on a hostile one"
    bomb, memory, flood, endless = await running
    assert bomb["timed_out"] or bomb["exit_code"] != 0, bomb  # cut, or out of pids
    assert memory["exit_code"] == 137, memory  # the OOM killer, inside its own cgroup
    assert flood["timed_out"]
    assert flood["stdout_truncated"]
    assert len(flood["stdout"]) <= 16 * 2**20
    assert endless["timed_out"]
    after = await run(api, hostile, argv=["echo", "alive"])
    assert after["stdout"] == "alive\n"


async def test_a_planted_link_is_read_as_the_sandbox_sees_it(
    api: httpx.AsyncClient, worker: AppProcess
) -> None:
    """Links an earlier command planted, to / and to a file, are followed inside the
    sandbox: their targets are the sandbox's own files, never the host's."""
    sid = (await create(api))["id"]
    await run(api, sid, command="ln -s / /tmp/root; ln -s /etc/hostname /tmp/name")
    own = (await run(api, sid, argv=["cat", "/etc/hostname"]))["stdout"]
    url = f"/v1/sandboxes/{sid}/files"
    for path in ("/tmp/name", "/tmp/root/etc/hostname"):
        got = await api.get(url, params={"path": path}, headers=ALICE)
        assert got.status_code == 200, got.text
        assert got.text == own
    assert Path("/etc/hostname").read_text() != own  # noqa: ASYNC240
    listing = await api.get(f"{url}/list", params={"path": "/tmp/root"}, headers=ALICE)
    names = {entry["name"] for entry in listing.json()["entries"]}
    assert ".dockerenv" in names  # the container's root, not the host's
