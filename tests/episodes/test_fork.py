"""Forking an open episode (`POST /v1/episodes/{id}/fork`) through a real worker and Docker.

A child goes on from the parent's step with a copy of the parent's files as they were
then (the parent's later writes never reach it), the parent's history byte for byte, and
a sandbox of its own (siblings never see each other's writes). A refused fork leaves no
row behind.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from app.clients.episode_env import AsyncEnv
from app.config import Settings
from app.db import models
from app.db.engine import create_engine, create_sessions
from tests.episodes.conftest import (
    ALICE,
    BOB,
    SUBMIT,
    containers,
    open_episode,
    sandbox_gone,
    step,
    tool_turn,
)
from tests.support.processes import ready_worker
from tests.support.zygote import AppProcess

FILE = "/testbed/notes.txt"


def bash(command: str, call_id: str = "c1") -> dict[str, Any]:
    return tool_turn(call_id, "execute_bash", {"command": command})


async def run(api: httpx.AsyncClient, episode: str, command: str) -> dict[str, Any]:
    """One `execute_bash` turn; its answer."""
    response = await step(api, episode, bash(command))
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    assert answer["done"] is False, answer
    return answer


def output(answer: dict[str, Any]) -> str:
    """The command's stdout, from the tool message (`Exit code: 0`, `[STDOUT]`, output)."""
    content: str = answer["messages"][0]["content"]
    assert content.startswith("Exit code: 0\n"), content
    return content.rsplit("\nSteps Remaining:", 1)[0].split("[STDOUT]\n", 1)[1]


async def fork(api: httpx.AsyncClient, episode: str, n: int, headers: Any = None) -> httpx.Response:
    return await api.post(f"/v1/episodes/{episode}/fork", json={"n": n}, headers=headers or ALICE)


async def episode_rows(settings: Settings) -> dict[str, int]:
    """Alice's episodes by status."""
    engine = create_engine(settings.database_url)
    try:
        async with create_sessions(engine)() as session:
            rows = await session.execute(
                select(models.EpisodeRow.status, func.count())
                .where(models.EpisodeRow.tenant_id == "alice")
                .group_by(models.EpisodeRow.status)
            )
            return {status: count for status, count in rows.all()}
    finally:
        await engine.dispose()


async def test_children_start_from_the_files_and_history_of_the_branch_step(
    api: httpx.AsyncClient, worker: AppProcess
) -> None:
    opened = await open_episode(api, prompt="fork me", limits={"max_steps": 12})
    parent = opened["id"]
    history = list(opened["messages"])

    async def parent_turn(command: str) -> dict[str, Any]:
        answer = await run(api, parent, command)
        history.extend([bash(command), *answer["messages"]])
        return answer

    await parent_turn("echo one > /tmp/scratch.txt")
    await parent_turn("mkdir -p /testbed/work && echo two > /testbed/work/two.txt")
    await parent_turn(f"echo after-3 > {FILE} && rm -r /testbed/output")

    response = await fork(api, parent, 2)
    assert response.status_code == 201, response.text
    forked = response.json()
    assert forked["parent_id"] == parent
    assert forked["step"] == 3
    assert forked["timings"]["snapshot_bytes"] > 0
    first, second = forked["children"]
    for child in (first, second):
        assert child["status"] == "open"
        assert child["parent_id"] == parent
        assert child["fork_step"] == 3
        assert child["steps"] == 3
        # Exactly the parent's conversation, byte for byte.
        assert json.dumps(child["messages"]) == json.dumps(history)
        assert child["tools"] == opened["tools"]
        assert len(containers(f"sandhive.episode={child['id']}")) == 1

    # The parent goes on and changes the file; the children keep it as it was at step 3.
    await parent_turn(f"echo after-5 > {FILE}")
    changed = await parent_turn(f"cat {FILE}")
    assert output(changed) == "after-5\n"

    seen = await run(api, first["id"], f"cat {FILE} /tmp/scratch.txt /testbed/work/two.txt")
    assert output(seen) == "after-3\none\ntwo\n"
    assert seen["messages"][0]["content"].endswith("\nSteps Remaining: 8")
    gone = await run(api, first["id"], "ls /testbed")  # deleted in the parent: not back
    assert "output" not in output(gone).split()
    assert "notes.txt" in output(gone).split()

    # Siblings never see each other's writes.
    await run(api, first["id"], f"echo from-first > {FILE}")
    sibling = await run(api, second["id"], f"cat {FILE}")
    assert output(sibling) == "after-3\n"

    got = await api.get(f"/v1/episodes/{first['id']}", headers=ALICE)
    assert got.json()["parent_id"] == parent
    assert got.json()["fork_step"] == 3
    assert got.json()["steps"] >= 3

    for episode in (parent, first["id"], second["id"]):
        closed = await api.delete(f"/v1/episodes/{episode}", headers=ALICE)
        assert closed.status_code == 200, closed.text
        await sandbox_gone(f"sandhive.episode={episode}")


async def test_a_child_submits_and_its_trajectory_holds_the_shared_steps(
    api: httpx.AsyncClient, worker: AppProcess
) -> None:
    opened = await open_episode(api, prompt="fork and submit", limits={"max_steps": 6})
    parent = opened["id"]
    await run(api, parent, "echo 42 > /testbed/output/answer.txt")
    child = (await fork(api, parent, 1)).json()["children"][0]
    ended = await step(api, child["id"], SUBMIT)
    assert ended.json()["done"] is True
    assert ended.json()["finish_reason"] == "submitted"
    got = (await api.get(f"/v1/episodes/{child['id']}", headers=ALICE)).json()
    assert got["answer"] == "42\n"
    assert got["steps"] == 2
    atif = (await api.get(f"/v1/episodes/{child['id']}/trajectory", headers=ALICE)).json()
    commands = [
        call["arguments"].get("command")
        for turn in atif["steps"]
        for call in turn.get("tool_calls") or []
    ]
    assert commands[0] == "echo 42 > /testbed/output/answer.txt"
    # The parent was not touched by its child's end.
    assert (await api.get(f"/v1/episodes/{parent}", headers=ALICE)).json()["status"] == "open"
    await api.delete(f"/v1/episodes/{parent}", headers=ALICE)
    await sandbox_gone(f"sandhive.episode={parent}")


async def test_async_env_fork_returns_envs_that_go_on(
    api: httpx.AsyncClient, worker: AppProcess
) -> None:
    api.headers.update(ALICE)
    env = AsyncEnv(api, {"prompt": "env fork", "limits": {"max_steps": 5}})
    await env.reset()
    await env.step(bash("echo base > /tmp/base.txt"))
    children = await env.fork(3)
    assert [c.messages for c in children] == [env.messages] * 3
    assert len({c.id for c in children}) == 3
    for index, child in enumerate(children):
        result = await child.step(bash(f"cat /tmp/base.txt; echo {index} >> /tmp/base.txt"))
        assert output({"messages": result.messages}) == "base\n"  # not a sibling's line
        assert child.messages[-1] == result.messages[-1]
    for env_ in (env, *children):
        await env_.close()


@pytest.fixture
def small_settings(make_episode_settings: Callable[..., Settings]) -> Settings:
    return make_episode_settings(
        fork_max_children=4,
        fork_max_snapshot_mb=1,
        tenant_max_active_tasks=4,
        episode_slots=4,
    )


@pytest.fixture
def small_worker(small_settings: Settings, tmp_path: Path) -> Iterator[AppProcess]:
    with ready_worker(small_settings, tmp_path / "worker.log") as process:
        yield process


async def test_refused_forks_say_why_and_leave_nothing(
    small_settings: Settings,
    small_worker: AppProcess,
) -> None:
    from app.api.app import create_app
    from tests.api.conftest import serve

    async with serve(create_app(small_settings)) as api:
        api.timeout = httpx.Timeout(120.0)
        opened = await open_episode(api, prompt="refusals")
        parent = opened["id"]

        assert (await fork(api, parent, 1, headers=BOB)).status_code == 404
        assert (await fork(api, "epi_nope", 1)).status_code == 404
        for n in (0, 5):
            refused = await fork(api, parent, n)
            assert refused.status_code == 422, refused.text
        over_cap = await fork(api, parent, 4)  # 1 open + 4 > the tenant's 4
        assert over_cap.status_code == 429, over_cap.text
        assert over_cap.json()["error"]["details"]["limit"] == "tenant_max_active_tasks"

        await run(api, parent, "head -c 2000000 /dev/urandom > /testbed/big.bin")
        too_large = await fork(api, parent, 1)
        assert too_large.status_code == 422, too_large.text
        assert "SANDHIVE_FORK_MAX_SNAPSHOT_MB" in too_large.json()["error"]["message"]
        assert too_large.json()["error"]["details"]["limit"] == "fork_max_snapshot_mb"
        assert await episode_rows(small_settings) == {"open": 1}  # nothing half-made
        assert len(siblings_of(parent)) == 1  # no child's sandbox was started

        await run(api, parent, "rm /testbed/big.bin")
        three = await fork(api, parent, 3)  # 4 slots: all taken now
        assert three.status_code == 201, three.text
        second = await open_episode_raw(api)
        assert second.status_code == 429, second.text

        ended = await step(api, parent, SUBMIT)
        assert ended.json()["done"] is True
        after_end = await fork(api, parent, 1)
        assert after_end.status_code == 409, after_end.text
        assert "replay" in after_end.json()["error"]["message"]
        rows = await episode_rows(small_settings)
        assert rows.get("open") == 3
        assert rows.get("opening") is None
        for child in three.json()["children"]:
            await api.delete(f"/v1/episodes/{child['id']}", headers=ALICE)
            await sandbox_gone(f"sandhive.episode={child['id']}")


def siblings_of(episode: str) -> list[str]:
    """The episode sandboxes of the worker holding `episode`'s (its own included)."""
    (box,) = containers(f"sandhive.episode={episode}")
    label = '{{index .Config.Labels "sandhive.worker"}}'
    found = subprocess.run(
        ["docker", "inspect", "--format", label, box], capture_output=True, text=True, check=True
    )
    return containers(f"sandhive.worker={found.stdout.strip()}")


async def open_episode_raw(api: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await api.post("/v1/episodes", json={"prompt": "x", **body}, headers=ALICE)


async def test_a_persistent_shell_is_not_forked(
    api: httpx.AsyncClient, worker: AppProcess, episode_settings: Settings
) -> None:
    opened = await open_episode(api, prompt="persistent", tools={"shell": "persistent"})
    refused = await fork(api, opened["id"], 1)
    assert refused.status_code == 422, refused.text
    assert "persistent" in refused.json()["error"]["message"]
    assert await episode_rows(episode_settings) == {"open": 1}
    await api.delete(f"/v1/episodes/{opened['id']}", headers=ALICE)


@pytest.fixture
def impatient_settings(make_episode_settings: Callable[..., Settings]) -> Settings:
    return make_episode_settings(fork_timeout_s=0.2)


@pytest.fixture
def impatient_worker(impatient_settings: Settings, tmp_path: Path) -> Iterator[AppProcess]:
    with ready_worker(impatient_settings, tmp_path / "worker.log") as process:
        yield process


async def test_a_fork_that_outlasts_its_timeout_leaves_the_parent_and_no_child(
    impatient_settings: Settings, impatient_worker: AppProcess
) -> None:
    """503, the parent goes on as it was, and the children the worker started late (or
    could not start: their rows were gone) leave no row and no container."""
    from app.api.app import create_app
    from tests.api.conftest import serve

    async with serve(create_app(impatient_settings)) as api:
        api.timeout = httpx.Timeout(120.0)
        parent = (await open_episode(api, prompt="slow fork"))["id"]
        await run(api, parent, "head -c 150000000 /dev/zero > /testbed/big.bin")
        slow = await fork(api, parent, 2)
        assert slow.status_code == 503, slow.text
        assert "no answer from its worker" in slow.json()["error"]["message"]
        await asyncio.sleep(3)  # the worker finishes its snapshot and finds no child to start
        alive = await run(api, parent, "echo still here")
        assert output(alive) == "still here\n"
        assert await episode_rows(impatient_settings) == {"open": 1}
        assert len(siblings_of(parent)) == 1
        await api.delete(f"/v1/episodes/{parent}", headers=ALICE)
        await sandbox_gone(f"sandhive.episode={parent}")
