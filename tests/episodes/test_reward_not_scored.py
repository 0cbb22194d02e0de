"""What `/reward` answers for an episode that was not the policy's to lose: nothing to learn
from, so no score at all (409, `error_kind: infrastructure`), never the 0 of an episode
that did not submit. The episode rows are written as the worker's sweep leaves them."""

from __future__ import annotations

import httpx
import pytest

from app.db import models
from app.db.engine import Sessions
from app.ids import utc_now
from tests.api.conftest import assert_error
from tests.episodes.conftest import ALICE


async def ended_episode(sessions: Sessions, reason: str, error_kind: str | None) -> str:
    episode_id = f"ep_{reason}_{utc_now().timestamp():.0f}"
    async with sessions.begin() as session:
        session.add(
            models.EpisodeRow(
                id=episode_id,
                tenant_id="alice",
                status="done",
                prompt="What is 6 x 7?",
                spec={},
                scorer={"kind": "exact"},
                ground_truth="42",
                finish_reason=reason,
                error=None if error_kind is None else f"the episode was {reason}",
                error_kind=error_kind,
                answer=None,
                ended_at=utc_now(),
            )
        )
    return episode_id


@pytest.mark.parametrize("reason", ["worker_lost", "sandbox_error", "worker_stopped"])
async def test_an_episode_the_infrastructure_ended_is_not_scored(
    api: httpx.AsyncClient, sessions: Sessions, reason: str
) -> None:
    episode_id = await ended_episode(sessions, reason, "infrastructure")
    answered = await api.post(f"/v1/episodes/{episode_id}/reward", headers=ALICE)
    error = assert_error(answered, 409, "conflict")
    assert error["details"] == {"error_kind": "infrastructure", "finish_reason": reason}
    assert "not scored" in error["message"]


async def test_one_the_policy_ran_out_of_steps_in_still_scores_zero(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    episode_id = await ended_episode(sessions, "max_steps", None)
    answered = await api.post(f"/v1/episodes/{episode_id}/reward", headers=ALICE)
    assert answered.status_code == 200, answered.text
    assert (answered.json()["score"], answered.json()["reason"]) == (
        0.0,
        "never submitted (max_steps)",
    )
