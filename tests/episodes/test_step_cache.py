"""A step reads no row once its episode is known open (app/services/episodes/holders.py):
another tenant still gets 404, and an episode closed through another API process, or
ended by its loop, is still refused with 409 by the process that remembered it open."""

from __future__ import annotations

from pathlib import Path

import httpx

from app.config import Settings
from app.services.episodes.holders import HOLDERS
from tests.api.conftest import assert_error
from tests.e2e.fault_harness import cluster
from tests.episodes.conftest import ALICE, BOB, open_episode, step, tool_turn
from tests.support.zygote import AppProcess

TRUE = tool_turn("c1", "execute_bash", {"command": "true"})


async def test_a_remembered_episode_is_still_the_tenants_own_and_ends_for_every_process(
    episode_settings: Settings,
    worker: AppProcess,
    api: httpx.AsyncClient,
    tmp_path: Path,
) -> None:
    closed_elsewhere = await open_episode(api, prompt="closed by another API process")
    ran_out = await open_episode(api, prompt="ends by its loop", limits={"max_steps": 2})
    for opened in (closed_elsewhere, ran_out):
        assert (await step(api, opened["id"], TRUE)).status_code == 200
        assert HOLDERS.remembers(opened["id"])
    assert_error(await step(api, closed_elsewhere["id"], TRUE, headers=BOB), 404, "not_found")

    with cluster(episode_settings, tmp_path) as other:  # a `sandhive serve` process
        other.start_api()
        async with httpx.AsyncClient(base_url=other.base_url, timeout=120) as other_api:
            path = f"/v1/episodes/{closed_elsewhere['id']}"
            deleted = await other_api.delete(path, headers=ALICE)
        assert deleted.json()["status"] == "closed", deleted.text
    assert HOLDERS.remembers(closed_elsewhere["id"]), "this process never heard of the close"
    assert_error(await step(api, closed_elsewhere["id"], TRUE), 409, "conflict")
    assert not HOLDERS.remembers(closed_elsewhere["id"]), "forgotten once refused"

    last = (await step(api, ran_out["id"], TRUE)).json()
    assert (last["done"], last["finish_reason"]) == (True, "max_steps")
    assert not HOLDERS.remembers(ran_out["id"])
    assert_error(await step(api, ran_out["id"], TRUE), 409, "conflict")
