"""A step sent again with its `Idempotency-Key` (a trainer retrying after a timeout) runs the
turn once: the repeat, even while the first still runs, gets the first one's answer, the
final step's included; the same key with another message is refused."""

from __future__ import annotations

import asyncio

import httpx

from tests.api.conftest import assert_error
from tests.episodes.conftest import ALICE, SUBMIT, open_episode, tool_turn
from tests.support.zygote import AppProcess


async def keyed_step(
    api: httpx.AsyncClient, episode_id: str, message: dict[str, object], key: str
) -> httpx.Response:
    return await api.post(
        f"/v1/episodes/{episode_id}/step",
        json={"message": message},
        headers={**ALICE, "Idempotency-Key": key},
    )


async def test_a_repeated_step_runs_its_tool_once(
    worker: AppProcess, api: httpx.AsyncClient
) -> None:
    episode_id = (await open_episode(api, prompt="count", limits={"max_steps": 10}))["id"]
    bump = tool_turn("c1", "execute_bash", {"command": "sleep 1; echo x >> /tmp/n; wc -l < /tmp/n"})
    first, second = await asyncio.gather(
        keyed_step(api, episode_id, bump, "turn-1"), keyed_step(api, episode_id, bump, "turn-1")
    )
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    assert first.json()["messages"] == second.json()["messages"]
    assert "[STDOUT]\n1\n" in first.json()["messages"][0]["content"]
    late = await keyed_step(api, episode_id, bump, "turn-1")  # after both answered
    assert late.json()["messages"] == first.json()["messages"]

    other = tool_turn("c9", "execute_bash", {"command": "true"})
    assert_error(await keyed_step(api, episode_id, other, "turn-1"), 422, "idempotency_key_reused")

    count = tool_turn("c2", "execute_bash", {"command": "wc -l < /tmp/n"})
    counted = await keyed_step(api, episode_id, count, "turn-2")
    assert "[STDOUT]\n1\n" in counted.json()["messages"][0]["content"], "the tool ran once"

    ended = await keyed_step(api, episode_id, SUBMIT, "turn-3")
    again = await keyed_step(api, episode_id, SUBMIT, "turn-3")
    assert ended.json()["done"] is True
    assert again.status_code == 200
    assert again.json() == ended.json()
    unkeyed = await api.post(
        f"/v1/episodes/{episode_id}/step", json={"message": SUBMIT}, headers=ALICE
    )
    assert_error(unkeyed, 409, "conflict")
