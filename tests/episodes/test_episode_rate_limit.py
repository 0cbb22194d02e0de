"""Episodes are rate-limited like tasks (issue 16): a tenant over its request rate gets 429 in
the contract's error shape with Retry-After on the episode routes, and the refused call does
nothing (no episode opened, no step run); another tenant is not held back, and once the
Retry-After has passed the same episode goes on. One sandbox, on a real worker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import select

from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from tests.api.conftest import assert_error
from tests.episodes.conftest import (
    ALICE,
    BOB,
    SUBMIT,
    containers,
    open_episode,
    sandbox_gone,
    step,
    write_answer,
)
from tests.support.zygote import AppProcess

RATE_PER_S = 0.5  # one request back every 2 s: nothing refills while the test drains
BURST = 3


@pytest.fixture
def episode_settings(make_episode_settings: Callable[..., Settings]) -> Settings:
    """The episode settings with a per-tenant request rate (the `worker` and `api` use them)."""
    return make_episode_settings(rate_limit_per_s=RATE_PER_S, rate_limit_burst=BURST)


async def drain(api: httpx.AsyncClient, episode_id: str) -> None:
    """Spend alice's whole budget on cheap reads: the last of them is already refused."""
    answers = [
        (await api.get(f"/v1/episodes/{episode_id}", headers=ALICE)).status_code
        for _ in range(BURST + 1)
    ]
    assert answers[-1] == 429, answers
    assert set(answers) <= {200, 429}, answers


def assert_limited(response: httpx.Response) -> int:
    """A 429 in the contract's shape; its Retry-After, in seconds."""
    error = assert_error(response, 429, "too_many_requests")
    assert "alice" in error["message"]
    retry_after = int(response.headers["retry-after"])
    assert 1 <= retry_after <= 1 / RATE_PER_S, retry_after
    return retry_after


async def stored_episodes(sessions: Sessions) -> list[str]:
    async with sessions() as session:
        return list(await session.scalars(select(models.EpisodeRow.id)))


async def test_a_tenant_over_its_rate_gets_429_on_the_episode_routes_and_nothing_runs(
    worker: AppProcess, api: httpx.AsyncClient, sessions: Sessions
) -> None:
    opened = await open_episode(
        api, prompt="What is 6 x 7?", scorer={"kind": "exact"}, ground_truth="42"
    )
    episode_id = opened["id"]
    wrote = await step(api, episode_id, write_answer("42"))
    assert wrote.status_code == 200, wrote.text

    await drain(api, episode_id)
    retry_after = assert_limited(await step(api, episode_id, write_answer("41")))
    assert_limited(await api.post("/v1/episodes", json={"prompt": "p"}, headers=ALICE))
    assert_limited(await api.post(f"/v1/episodes/{episode_id}/reward", headers=ALICE))
    assert_limited(await api.delete(f"/v1/episodes/{episode_id}", headers=ALICE))

    # Refused means not done: no second episode, and this one still open (its sandbox runs).
    assert await stored_episodes(sessions) == [episode_id]
    assert len(containers(f"sandhive.episode={episode_id}")) == 1
    # The budget is alice's: bob is answered (his 404 of her episode), not limited.
    bobs = await step(api, episode_id, SUBMIT, headers=BOB)
    assert_error(bobs, 404, "not_found")

    await asyncio.sleep(retry_after)
    submitted = await step(api, episode_id, SUBMIT)
    assert submitted.status_code == 200, submitted.text
    assert (submitted.json()["done"], submitted.json()["finish_reason"]) == (True, "submitted")
    async with sessions() as session:
        row = await session.get(models.EpisodeRow, episode_id)
    assert row is not None  # the refused step (writing 41) never ran: two steps, answer 42
    assert (row.status, row.answer, row.steps) == ("done", "42", 2)
    await sandbox_gone(f"sandhive.episode={episode_id}")
