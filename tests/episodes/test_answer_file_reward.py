"""`unsubmitted: "answer_file"`: an episode that ran out of steps without `submit` is scored on
the answer file it wrote, as the paper's RL environment's `compute_final_reward` reads
`answer.txt` whatever ended the loop; by default (`zero`) it scores 0, the paper's rule for
overlong episodes. Real worker, real sandboxes; the judge is the scripted server."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from app.scripted import ScriptedLLMServer
from tests.episodes.conftest import ALICE, open_episode, step, tool_turn, write_answer
from tests.support.experiments import scripted
from tests.support.zygote import AppProcess

EXACT = {"scorer": {"kind": "exact"}, "ground_truth": "42", "limits": {"max_steps": 2}}
LOOK = tool_turn("c9", "execute_bash", {"command": "ls"})


async def ran_out_of_steps(api: httpx.AsyncClient, answer: str | None, **body: Any) -> str:
    """An episode that wrote `answer` (None: nothing), then ran out of steps unsubmitted."""
    opened = await open_episode(api, prompt="What is 6 x 7?", **{**EXACT, **body})
    first = await step(api, opened["id"], LOOK if answer is None else write_answer(answer))
    assert first.json()["done"] is False, first.text
    last = (await step(api, opened["id"], LOOK)).json()
    assert (last["done"], last["finish_reason"]) == (True, "max_steps")
    return str(opened["id"])


async def reward(api: httpx.AsyncClient, episode_id: str) -> dict[str, Any]:
    answered = await api.post(f"/v1/episodes/{episode_id}/reward", headers=ALICE)
    assert answered.status_code == 200, answered.text
    found: dict[str, Any] = answered.json()
    return found


async def test_the_answer_file_of_an_unsubmitted_episode_is_scored_when_asked(
    worker: AppProcess, api: httpx.AsyncClient
) -> None:
    asked, default, wrong, none = await asyncio.gather(
        ran_out_of_steps(api, "42", unsubmitted="answer_file"),
        ran_out_of_steps(api, "42"),
        ran_out_of_steps(api, "41", unsubmitted="answer_file"),
        ran_out_of_steps(api, None, unsubmitted="answer_file"),
    )
    scored = await reward(api, asked)
    assert (scored["score"], scored["reason"], scored["finish_reason"]) == (1.0, None, "max_steps")
    zero = await reward(api, default)
    assert (zero["score"], zero["reason"]) == (0.0, "never submitted (max_steps)")
    assert (await reward(api, wrong))["score"] == 0.0  # scored, and wrong
    nothing = await reward(api, none)
    assert (nothing["score"], nothing["reason"]) == (
        0.0,
        "no answer file (never submitted: max_steps)",
    )


async def test_a_deferred_scorer_scores_the_unsubmitted_answer_file_in_the_worker(
    worker: AppProcess, api: httpx.AsyncClient, scripted_llm: ScriptedLLMServer
) -> None:
    judge = scripted(scripted_llm, "unsubmitted-judge", "It matches.\nCORRECT")
    scorer = {"kind": "llm_judge", "profile": "default", "model": judge}
    episode_id = await ran_out_of_steps(api, "42", unsubmitted="answer_file", scorer=scorer)
    scored = await reward(api, episode_id)
    assert (scored["score"], scored["scorer"]) == (1.0, "llm_judge")
    assert "CANDIDATE ANSWER:\n42" in scored["detail"]["prompt"][0]["content"]
    assert scripted_llm.requests[judge] == 1


async def test_an_unknown_rule_is_refused(api: httpx.AsyncClient) -> None:
    refused = await api.post(
        "/v1/episodes", json={"prompt": "p", "unsubmitted": "half"}, headers=ALICE
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["details"][0]["loc"] == ["body", "unsubmitted"]
