"""The episode sweep with real worker processes: an episode nobody calls again after its
worker was killed, one no worker ever took, and one a restarted worker's rows still name
are all ended with an infrastructure error, and the tenant's cap is freed.

(test_episodes.py's killed-worker test steps the episode after the kill, so the API is
what notices there; here nobody touches the episode but to read it.)
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from app.api.app import create_app
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.ids import utc_now
from app.schemas.episodes import EpisodeCreate
from app.services.episodes import service as episodes
from tests.api.conftest import assert_error, serve
from tests.episodes.conftest import ALICE, containers, open_episode
from tests.episodes.test_episodes import wait_for
from tests.support.processes import ready_worker


@pytest.fixture
def sweep_settings(make_episode_settings: Callable[..., Settings]) -> Settings:
    """The default open timeout: the dead worker's sweep does not depend on it, and a
    sandbox start on a loaded machine took longer than a second (the open then failed)."""
    return make_episode_settings(worker_reap_interval_s=0.5, tenant_max_active_tasks=1)


async def status_of(sessions: Sessions, episode_id: str) -> models.EpisodeRow:
    async with sessions() as session:
        row = await session.get(models.EpisodeRow, episode_id)
    assert row is not None
    return row


def assert_swept(row: models.EpisodeRow, why: str) -> None:
    assert (row.status, row.finish_reason, row.error_kind) == (
        "done",
        "worker_lost",
        "infrastructure",
    ), row.error
    assert row.error is not None
    assert why in row.error
    assert "sweep" in row.error


async def test_an_untouched_episode_of_a_killed_worker_is_ended_and_the_cap_freed(
    sweep_settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    async with serve(create_app(sweep_settings)) as api:
        api.timeout = httpx.Timeout(120.0)
        with ready_worker(sweep_settings, tmp_path / "doomed.log") as doomed:
            opened = await open_episode(api, prompt="left behind")
            doomed.send_signal(signal.SIGKILL)
            doomed.wait(timeout=10)
        full = await api.post("/v1/episodes", json={"prompt": "one more"}, headers=ALICE)
        assert_error(full, 429, "too_many_requests")  # the dead one still counts: open
        assert (await status_of(sessions, opened["id"])).status == "open"
        with ready_worker(sweep_settings, tmp_path / "sweeper.log"):

            async def swept() -> bool:
                return (await status_of(sessions, opened["id"])).status != "open"

            await wait_for("the sweep to end the dead worker's episode", swept, 60)
            assert_swept(await status_of(sessions, opened["id"]), "is gone")
            state = (await api.get(f"/v1/episodes/{opened['id']}", headers=ALICE)).json()
            assert (state["finish_reason"], state["error_kind"]) == (
                "worker_lost",
                "infrastructure",
            )

            async def reaped() -> bool:
                return not await asyncio.to_thread(containers, f"sandhive.episode={opened['id']}")

            await wait_for("the dead worker's sandbox to be reaped", reaped, 60)
            again = await open_episode(api, prompt="the cap is free again")
            assert (await api.delete(f"/v1/episodes/{again['id']}", headers=ALICE)).is_success


async def stored(settings: Settings, sessions: Sessions, **values: object) -> str:
    """An episode row as `POST /v1/episodes` stores it, then changed as given."""
    row = episodes.new_row(settings, "alice", EpisodeCreate(prompt="stranded"))
    for name, value in values.items():
        setattr(row, name, value)
    await episodes.store(sessions, settings, row)
    return row.id


async def test_never_claimed_and_a_restarted_workers_own_are_ended_a_fresh_one_kept(
    make_episode_settings: Callable[..., Settings], sessions: Sessions, tmp_path: Path
) -> None:
    settings = make_episode_settings(
        worker_reap_interval_s=0.5, episode_open_timeout_s=1.0, worker_name="w-restarted"
    )
    long_ago = utc_now() - timedelta(hours=1)
    unclaimed = await stored(settings, sessions, created_at=long_ago)
    fresh = await stored(settings, sessions)  # its API may still be waiting for a worker
    predecessor = await stored(settings, sessions, status="open", worker="w-restarted")
    with ready_worker(settings, tmp_path / "worker.log"):
        # The worker's own are ended before it logs "ready"; the sweep runs at once after.
        assert_swept(await status_of(sessions, predecessor), "w-restarted restarted")

        async def swept() -> bool:
            return (await status_of(sessions, unclaimed)).status != "opening"

        await wait_for("the sweep to end the unclaimed episode", swept, 30)
        assert_swept(await status_of(sessions, unclaimed), "no worker ever opened it")
        await asyncio.sleep(2 * settings.worker_reap_interval_s)  # more sweeps: it stays
        assert (await status_of(sessions, fresh)).status == "opening"
