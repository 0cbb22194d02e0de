"""Episodes through the API with a real worker process: rewards, the nudge, 409 after the
end, tenant isolation on every route, close, the idle reaper and a killed worker."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select

from app.agent.tools import NO_TOOL_CALL_NUDGE
from app.api.app import create_app
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from tests.api.conftest import assert_error, serve
from tests.episodes.conftest import (
    ALICE,
    BOB,
    SUBMIT,
    containers,
    open_episode,
    sandbox_gone,
    step,
    wait_for,
    write_answer,
)
from tests.support.processes import ready_worker
from tests.support.zygote import AppProcess

SCORED = {"scorer": {"kind": "exact"}, "ground_truth": "42"}


async def test_submitted_answer_is_rewarded_and_the_sandbox_removed(
    worker: AppProcess, api: httpx.AsyncClient
) -> None:
    opened = await open_episode(api, prompt="What is 6 x 7?", limits={"max_steps": 10}, **SCORED)
    episode_id = opened["id"]
    assert containers(f"sandhive.episode={episode_id}"), "the sandbox runs while it is open"
    early = await api.post(f"/v1/episodes/{episode_id}/reward", headers=ALICE)
    assert_error(early, 409, "conflict")
    wrote = (await step(api, episode_id, write_answer("42"))).json()
    assert wrote["done"] is False
    assert wrote["messages"][0]["role"] == "tool"
    assert wrote["messages"][-1]["content"].endswith("\nSteps Remaining: 9")
    submitted = await step(api, episode_id, SUBMIT)
    assert submitted.status_code == 200, submitted.text
    ended = submitted.json()
    assert (ended["done"], ended["finish_reason"], ended["error_kind"]) == (True, "submitted", None)
    await sandbox_gone(f"sandhive.episode={episode_id}")
    reward = await api.post(f"/v1/episodes/{episode_id}/reward", headers=ALICE)
    assert reward.status_code == 200, reward.text
    assert (reward.json()["score"], reward.json()["scorer"]) == (1.0, "exact")
    after = await step(api, episode_id, SUBMIT)
    assert_error(after, 409, "conflict")
    state = (await api.get(f"/v1/episodes/{episode_id}", headers=ALICE)).json()
    assert (state["status"], state["answer"], state["steps"]) == ("done", "42", 2)


async def test_wrong_answer_scores_0_and_never_submitting_scores_0_with_the_reason(
    worker: AppProcess, api: httpx.AsyncClient
) -> None:
    wrong, unsubmitted = await asyncio.gather(
        open_episode(api, prompt="6 x 7?", **SCORED),
        open_episode(api, prompt="6 x 7?", limits={"max_steps": 2}, **SCORED),
    )
    await step(api, wrong["id"], write_answer("41"))
    await step(api, wrong["id"], SUBMIT)
    scored = (await api.post(f"/v1/episodes/{wrong['id']}/reward", headers=ALICE)).json()
    assert (scored["score"], scored["reason"]) == (0.0, None)

    assert unsubmitted["messages"][1]["content"].endswith("\nSteps Remaining: 2")
    talk = {"role": "assistant", "content": "Let me think."}
    nudged = (await step(api, unsubmitted["id"], talk)).json()
    assert nudged["done"] is False
    assert nudged["messages"] == [
        {"role": "user", "content": NO_TOOL_CALL_NUDGE + "\nSteps Remaining: 1"}
    ]
    last = (await step(api, unsubmitted["id"], write_answer("42"))).json()
    assert (last["done"], last["finish_reason"]) == (True, "max_steps")
    zero = (await api.post(f"/v1/episodes/{unsubmitted['id']}/reward", headers=ALICE)).json()
    assert zero["score"] == 0.0
    assert "never submitted" in zero["reason"]


async def test_another_tenant_gets_404_on_every_route(
    worker: AppProcess, api: httpx.AsyncClient
) -> None:
    opened = await open_episode(api, prompt="mine", **SCORED)
    path = f"/v1/episodes/{opened['id']}"
    for response in (
        await api.get(path, headers=BOB),
        await step(api, opened["id"], SUBMIT, headers=BOB),
        await api.post(f"{path}/reward", headers=BOB),
        await api.delete(path, headers=BOB),
    ):
        assert_error(response, 404, "not_found")
    # Nothing of it changed: still open, still stepping for its own tenant.
    assert (await api.get(path, headers=ALICE)).json()["status"] == "open"
    assert (await step(api, opened["id"], write_answer("1"))).status_code == 200
    closed = await api.delete(path, headers=ALICE)
    assert closed.status_code == 200, closed.text
    assert closed.json()["status"] == "closed"
    await sandbox_gone(f"sandhive.episode={opened['id']}")
    assert_error(await step(api, opened["id"], SUBMIT), 409, "conflict")


async def test_bad_requests_are_refused_with_nothing_written(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    no_llm = await api.post("/v1/episodes", json={"prompt": "x", "llm": {}}, headers=ALICE)
    assert_error(no_llm, 422, "invalid_input")
    # A deferred scorer is checked as an experiment's is: code, limits, the judge's profile.
    for scorer, where in (
        ({"kind": "python", "code": "def score(a, g): 1"}, "compute_score"),
        ({"kind": "python", "code": "def compute_score(a, g):\n 1", "timeout_s": 10**6}, "timeout"),
        ({"kind": "llm_judge", "profile": "nope"}, "unknown llm profile 'nope'"),
    ):
        refused = await api.post(
            "/v1/episodes", json={"prompt": "x", "scorer": scorer}, headers=ALICE
        )
        assert where in assert_error(refused, 422, "invalid_input")["message"], refused.text
    unknown = {"prompt": "x", "scorer": {"kind": "nope"}}
    assert_error(await api.post("/v1/episodes", json=unknown, headers=ALICE), 422, "invalid_input")
    blank = await api.post("/v1/episodes", json={"prompt": " \n "}, headers=ALICE)
    assert "not only whitespace" in assert_error(blank, 422, "invalid_input")["message"]
    assert_error(await api.post("/v1/episodes", json={"prompt": "x"}), 401, "unauthorized")
    assert_error(await api.get("/v1/episodes/epi_nope", headers=ALICE), 404, "not_found")
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(models.EpisodeRow)) == 0


async def test_no_worker_to_open_it_is_a_503_at_once_and_nothing_stored(
    make_episode_settings: Callable[..., Settings], sessions: Sessions, redis: Redis
) -> None:
    assert await redis.dbsize() == 0, "flushed: no worker heartbeat left by another test"
    async with serve(create_app(make_episode_settings(episode_open_timeout_s=600.0))) as api:
        async with asyncio.timeout(30):  # not the open timeout: nobody to wait for
            refused = await api.post("/v1/episodes", json={"prompt": "nobody"}, headers=ALICE)
    error = assert_error(refused, 503, "unavailable")
    assert error["details"]["error_kind"] == "infrastructure", refused.text
    assert "sandhive worker" in error["message"]
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(models.EpisodeRow)) == 0


@pytest.fixture
def idle_settings(make_episode_settings: Callable[..., Settings]) -> Settings:
    return make_episode_settings(episode_idle_timeout_s=1.5, tenant_max_active_tasks=1)


async def test_an_abandoned_episode_is_closed_and_its_sandbox_removed(
    idle_settings: Settings, tmp_path: Path
) -> None:
    with ready_worker(idle_settings, tmp_path / "worker.log"):
        async with serve(create_app(idle_settings)) as api:
            api.timeout = httpx.Timeout(120.0)
            opened = await open_episode(api, prompt="abandoned")
            path = f"/v1/episodes/{opened['id']}"
            # It counts against the tenant's cap of active work, as a task does.
            over = await api.post("/v1/episodes", json={"prompt": "one more"}, headers=ALICE)
            assert_error(over, 429, "too_many_requests")
            task = await api.post("/v1/tasks", json={"prompt": "a task"}, headers=ALICE)
            assert_error(task, 429, "too_many_requests")

            async def reaped() -> bool:
                state = (await api.get(path, headers=ALICE)).json()
                return bool(state["status"] == "closed")

            await wait_for("the idle episode to be closed", reaped, 30)
            state = (await api.get(path, headers=ALICE)).json()
            assert state["finish_reason"] == "idle"
            await sandbox_gone(f"sandhive.episode={opened['id']}")
            assert_error(await step(api, opened["id"], SUBMIT), 409, "conflict")
            again = await open_episode(api, prompt="the cap is free again")
            assert (await api.delete(f"/v1/episodes/{again['id']}", headers=ALICE)).is_success


async def test_a_killed_worker_ends_its_episode_with_an_infrastructure_error(
    episode_settings: Settings,
    worker: AppProcess,
    api: httpx.AsyncClient,
    tmp_path: Path,
) -> None:
    opened = await open_episode(api, prompt="doomed")
    assert (await step(api, opened["id"], write_answer("1"))).status_code == 200
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    lost = await step(api, opened["id"], SUBMIT)
    error = assert_error(lost, 503, "unavailable")
    assert error["details"]["error_kind"] == "infrastructure"
    state = (await api.get(f"/v1/episodes/{opened['id']}", headers=ALICE)).json()
    assert (state["status"], state["finish_reason"], state["error_kind"]) == (
        "done",
        "worker_lost",
        "infrastructure",
    )
    assert "infrastructure" in state["error"]
    assert_error(await step(api, opened["id"], SUBMIT), 409, "conflict")
    # Another worker reaps the dead one's sandbox (it has no task: only its worker dooms it).
    with ready_worker(episode_settings, tmp_path / "rescuer.log"):

        async def removed() -> bool:
            return not await asyncio.to_thread(containers, f"sandhive.episode={opened['id']}")

        await wait_for("the dead worker's sandbox to be reaped", removed, 60)
