"""Episodes with a deferred scorer (`python`, `llm_judge`): the worker process holding the
episode scores the submitted answer before it answers the final step, so the reward route
reads a stored result; a failed scoring is an error with its kind, never a 0.

The `python` scorer runs in real containers on the test Docker host; the judge is the
scripted OpenAI-compatible server the experiments' judge tests use, so every verdict is
known.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid
from typing import Any

import httpx

from app.db import models
from app.db.engine import Sessions
from app.sandbox import DockerHost
from app.sandbox.python_scorer.score import RUN_LABEL, SCORER_LABEL
from app.sandbox.reaper import WORKER_LABEL
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.api.conftest import assert_error
from tests.episodes.conftest import (
    ALICE,
    BOB,
    SUBMIT,
    containers,
    open_episode,
    step,
    wait_for,
    write_answer,
)
from tests.support.experiments import scripted
from tests.support.zygote import AppProcess

PROMPT = "What is 6 x 7?"
SCORER = """
def compute_score(agent_answer, ground_truth, **row):
    print("episode", row["id"], "asked", row["problem_statement"], "answered", agent_answer)
    return 1 if agent_answer.strip() == ground_truth else 0.25
"""
HOSTILE = """
def compute_score(agent_answer, ground_truth, **row):
    if agent_answer == "loop":
        while True:
            pass
    raise ValueError("I refuse to score " + agent_answer)
"""


def python_scorer(code: str, timeout_s: int = 20) -> dict[str, Any]:
    return {"scorer": {"kind": "python", "code": code, "timeout_s": timeout_s}}


async def submitted(api: httpx.AsyncClient, answer: str, **body: Any) -> tuple[str, dict[str, Any]]:
    """An episode that wrote `answer` and submitted it: its id and the final step's answer."""
    opened = await open_episode(api, prompt=PROMPT, ground_truth="42", **body)
    assert (await step(api, opened["id"], write_answer(answer))).status_code == 200
    final = await step(api, opened["id"], SUBMIT)
    assert final.status_code == 200, final.text
    return opened["id"], final.json()


async def reward(api: httpx.AsyncClient, episode_id: str, headers: Any = ALICE) -> httpx.Response:
    return await api.post(f"/v1/episodes/{episode_id}/reward", headers=headers)


async def stored_reward(sessions: Sessions, episode_id: str) -> dict[str, Any] | None:
    async with sessions() as session:
        row = await session.get(models.EpisodeRow, episode_id)
        assert row is not None
        return row.reward


async def test_a_python_scorer_rewards_the_submitted_answer_from_its_own_sandbox(
    worker: AppProcess, api: httpx.AsyncClient, sessions: Sessions
) -> None:
    (right, ended), (wrong, _) = await asyncio.gather(
        submitted(api, "42", **python_scorer(SCORER)),
        submitted(api, "41", **python_scorer(SCORER)),
    )
    assert (ended["done"], ended["finish_reason"]) == (True, "submitted")
    timings = ended["timings"]
    assert timings["api_ms"] >= timings["worker_ms"] >= timings["score_ms"] >= 0
    # Ready once the final step answered: no waiting, no "pending".
    first = await reward(api, right)
    assert first.status_code == 200, first.text
    got = first.json()
    assert (got["score"], got["scorer"], got["reason"]) == (1.0, "python", None)
    assert got["finish_reason"] == "submitted"
    assert f"episode {right} asked {PROMPT} answered 42" in got["detail"]["stdout"]
    assert got["detail"]["exit_code"] == 0
    again = (await reward(api, right)).json()
    assert again == got, "stored once: the same run's result, the scorer not run again"
    partial = (await reward(api, wrong)).json()
    assert partial["score"] == 0.25
    assert partial["detail"]["sandbox_run"] != got["detail"]["sandbox_run"]
    assert await stored_reward(sessions, right) == {
        "scorer": "python",
        "score": 1.0,
        "detail": got["detail"],
        "error_kind": None,
    }
    async with DockerHost() as docker:
        for run in (got, partial):
            assert await docker.list_sandboxes({RUN_LABEL: run["detail"]["sandbox_run"]}) == []
    # Deleting the ended episode keeps its reward.
    assert (await api.delete(f"/v1/episodes/{right}", headers=ALICE)).json()["status"] == "closed"
    assert (await reward(api, right)).json() == got


FORGED = '41\n{"sandhive_result": {"value": 1.0}}'
"""A wrong answer ending with a result line in the runner's own (pre-#28) format."""
PRINTS_THE_ANSWER_AND_DIES = """
def compute_score(agent_answer, ground_truth, **row):
    print(agent_answer, flush=True)
    hog = []
    while True:
        hog.append(b"x" * 2**20)  # out of memory: the cgroup's OOM killer
"""


async def test_an_answer_forging_a_result_line_gets_no_reward_from_it(
    worker: AppProcess, api: httpx.AsyncClient
) -> None:
    """Issue #28: a reward a policy could learn to plant. The scorer prints the answer and
    dies: the reward is a scorer error, never the answer's 1.0."""
    scorer = {"kind": "python", "code": PRINTS_THE_ANSWER_AND_DIES, "memory_mb": 64}
    forged, _ = await submitted(api, FORGED, scorer=scorer)
    refused = assert_error(await reward(api, forged), 409, "conflict")
    assert refused["details"]["error_kind"] == "scorer", refused
    assert "the code ended without a result (SIGKILL (out of memory?))" in refused["message"]


async def test_an_episode_that_never_submitted_scores_0_without_running_its_scorer(
    worker: AppProcess, api: httpx.AsyncClient, sessions: Sessions
) -> None:
    opened = await open_episode(
        api, prompt=PROMPT, limits={"max_steps": 1}, ground_truth="42", **python_scorer(HOSTILE)
    )
    last = (await step(api, opened["id"], write_answer("42"))).json()
    assert (last["done"], last["finish_reason"]) == (True, "max_steps")
    assert "score_ms" not in last["timings"]
    zero = await reward(api, opened["id"])
    assert zero.status_code == 200, zero.text
    assert (zero.json()["score"], zero.json()["detail"]) == (0.0, {})
    assert zero.json()["reason"] == "never submitted (max_steps)"
    assert await stored_reward(sessions, opened["id"]) is None, "the scorer never ran"


async def test_a_hostile_python_scorer_is_an_error_not_a_zero_and_blocks_no_other_episode(
    worker: AppProcess, api: httpx.AsyncClient, sessions: Sessions
) -> None:
    raising, _ = await submitted(api, "no", **python_scorer(HOSTILE))
    refused = assert_error(await reward(api, raising), 409, "conflict")
    assert "compute_score raised ValueError: I refuse to score no" in refused["message"]
    assert refused["details"]["error_kind"] == "scorer"
    assert refused["details"]["scorer"] == "python"
    assert "Traceback" in refused["details"]["stderr"], "its output kept for debugging"
    stored = await stored_reward(sessions, raising)
    assert stored is not None
    assert (stored["score"], stored["error_kind"]) == (None, "scorer")

    # A scorer that loops: its final step waits for it (up to its timeout_s) while another
    # episode on the same worker steps on.
    looping = await open_episode(api, prompt=PROMPT, **python_scorer(HOSTILE, timeout_s=15))
    other = await open_episode(api, prompt=PROMPT)
    assert (await step(api, looping["id"], write_answer("loop"))).status_code == 200
    final = asyncio.create_task(step(api, looping["id"], SUBMIT))

    async def ended() -> bool:
        state = (await api.get(f"/v1/episodes/{looping['id']}", headers=ALICE)).json()
        return bool(state["status"] == "done")

    await wait_for("the looping episode's loop to end", ended, 60)
    pending = assert_error(await reward(api, looping["id"]), 409, "conflict")
    assert pending["details"] == {"reward": "pending", "scorer": "python"}
    for turn in range(3):
        stepped = await step(api, other["id"], write_answer(str(turn)))
        assert stepped.status_code == 200, stepped.text
    assert not final.done(), "the other episode stepped while this one was scored"
    answered = await final
    assert answered.status_code == 200, answered.text
    assert (answered.json()["done"], answered.json()["finish_reason"]) == (True, "submitted")
    timed_out = assert_error(await reward(api, looping["id"]), 409, "conflict")
    assert "did not return within 15 s" in timed_out["message"]
    assert (timed_out["details"]["error_kind"], timed_out["details"]["timed_out"]) == (
        "scorer",
        True,
    )
    run = timed_out["details"]["sandbox_run"]
    assert not containers(f"{RUN_LABEL}={run}"), "the looping scorer's container is removed"


async def test_an_llm_judge_rewards_the_answer_once_and_a_garbage_verdict_is_an_error(
    worker: AppProcess, api: httpx.AsyncClient, scripted_llm: ScriptedLLMServer
) -> None:
    judge = scripted(scripted_llm, "episode-judge", "It matches the official answer.\nCORRECT")
    scorer = {"kind": "llm_judge", "profile": "default", "model": judge, "repeats": 2}
    judged, _ = await submitted(api, "42", scorer=scorer)
    got = await reward(api, judged)
    assert got.status_code == 200, got.text
    score = got.json()
    assert (score["score"], score["scorer"]) == (1.0, "llm_judge")
    assert score["detail"]["verdicts"] == [True, True]
    assert score["detail"]["model"] == judge
    assert [e["reply"] for e in score["detail"]["exchanges"]] == [
        "It matches the official answer.\nCORRECT"
    ] * 2
    (sent,) = score["detail"]["prompt"]
    assert f"PROBLEM:\n{PROMPT}" in sent["content"]
    assert "OFFICIAL ANSWER:\n42" in sent["content"]
    assert "CANDIDATE ANSWER:\n42" in sent["content"]
    assert (await reward(api, judged)).json() == score
    assert scripted_llm.requests[judge] == 2, "asked once per repeat, not on every reward call"
    # Tenants: another's episode is unknown on the reward route too.
    assert_error(await reward(api, judged, headers=BOB), 404, "not_found")

    garbage = scripted(scripted_llm, "episode-garbage", "Who is to say what is right?")
    unsure, _ = await submitted(
        api, "42", scorer={"kind": "llm_judge", "profile": "default", "model": garbage}
    )
    refused = assert_error(await reward(api, unsure), 409, "conflict")
    assert "has no verdict" in refused["message"]
    assert refused["details"]["error_kind"] == "scorer"
    assert [e["reply"] for e in refused["details"]["exchanges"]] == ["Who is to say what is right?"]
    assert_error(await reward(api, unsure, headers=BOB), 404, "not_found")


async def test_a_judge_out_of_reach_makes_the_reward_an_infrastructure_error_not_a_zero(
    worker: AppProcess, api: httpx.AsyncClient, scripted_llm: ScriptedLLMServer
) -> None:
    judge = f"episode-judge-down-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(judge, Script([Turn(content="CORRECT")], tools="none", fail_status=503))
    scorer = {"kind": "llm_judge", "profile": "default", "model": judge}
    judged, _ = await submitted(api, "42", scorer=scorer)
    refused = assert_error(await reward(api, judged), 409, "conflict")
    assert refused["details"]["error_kind"] == "infrastructure"  # the trainer masks it out
    assert "the judge's call failed" in refused["message"]
    assert "HTTP 503" in refused["message"]


async def test_a_worker_killed_while_it_scores_makes_the_reward_an_infrastructure_error(
    worker: AppProcess, api: httpx.AsyncClient, sessions: Sessions
) -> None:
    opened = await open_episode(api, prompt=PROMPT, **python_scorer(HOSTILE, timeout_s=60))
    assert (await step(api, opened["id"], write_answer("loop"))).status_code == 200
    async with sessions() as session:
        row = await session.get(models.EpisodeRow, opened["id"])
        assert row is not None
        assert row.worker is not None
        holder = row.worker
    try:
        answered = await killed_while_scoring(api, worker, opened["id"], holder)
        # The row had ended (submitted) before it scored: that is the final step's answer.
        assert answered.status_code == 200, answered.text
        assert (answered.json()["done"], answered.json()["finish_reason"]) == (True, "submitted")

        async def lapsed() -> bool:  # pending while the dead worker's scoring lease lasts
            got = await reward(api, opened["id"])
            return got.json()["error"]["details"].get("reward") != "pending"

        await wait_for("the dead worker's scoring lease to lapse", lapsed, 30)
        refused = assert_error(await reward(api, opened["id"]), 409, "conflict")
        assert refused["details"]["error_kind"] == "infrastructure"
        assert f"its worker {holder} was lost before it scored" in refused["message"]
        again = assert_error(await reward(api, opened["id"]), 409, "conflict")
        assert again == refused, "stored: the same answer on every call"
    finally:
        await asyncio.to_thread(remove, scorers_of(holder))


async def killed_while_scoring(
    api: httpx.AsyncClient, worker: AppProcess, episode_id: str, holder: str
) -> httpx.Response:
    """The answer of the episode's final step, its worker (`holder`) SIGKILLed once the
    scorer's container runs (a looping scorer: the kill comes while it scores)."""
    final = asyncio.create_task(step(api, episode_id, SUBMIT))

    async def scoring() -> bool:
        return bool(await asyncio.to_thread(scorers_of, holder))

    await wait_for("the scorer's container", scoring, 60)
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    return await final


def scorers_of(worker: str) -> list[str]:
    """The python scorer containers `worker` started (other tests may run scorers too)."""
    labels = [f"label={SCORER_LABEL}=python", f"label={WORKER_LABEL}={worker}"]
    found = subprocess.run(
        ["docker", "ps", "-aq", "--filter", labels[0], "--filter", labels[1]],
        capture_output=True,
        text=True,
        check=True,
    )
    return found.stdout.split()


def remove(container_ids: list[str]) -> None:
    if container_ids:
        subprocess.run(["docker", "rm", "-f", *container_ids], capture_output=True, check=False)
