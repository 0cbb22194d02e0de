"""A task's verifier (Harbor's `tests/test.sh`), run by a real in-process worker in the
task's own sandbox once the agent has ended, or, for a vanilla task, in a fresh sandbox of
its image with the reply as the answer file. The agent is scripted; the verifiers are
shell scripts whose rewards the test chooses."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.support.experiments import scripted, settled, submit
from tests.worker.conftest import running_worker

CHECK_ANSWER = """\
#!/bin/bash
# Harbor's shape: judge what the agent left, write the reward.
if grep -qx 42 /testbed/output/answer.txt 2>/dev/null; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
echo "checked by $(whoami) in $PWD; helper says $(cat /tests/data/expected.txt)"
"""


def bash(command: str) -> Turn:
    return Turn(tool="execute_bash", arguments={"command": command})


def agent(llm: ScriptedLLMServer, *commands: str) -> str:
    name = f"agent-{uuid.uuid4().hex[:8]}"
    llm.add_script(name, Script([*(bash(c) for c in commands), Turn("submit")]))
    return name


def verifier(script: str = CHECK_ANSWER, **options: Any) -> dict[str, Any]:
    files = {"test.sh": script, "data/expected.txt": "42\n"}
    encoded = [
        {"path": path, "content_base64": base64.b64encode(text.encode()).decode()}
        for path, text in files.items()
    ]
    return {"files": encoded, **options}


async def submitted(client: httpx.AsyncClient, **body: Any) -> str:
    made = await client.post("/v1/tasks", json=body)
    assert made.status_code == 202, made.text
    task_id: str = made.json()["id"]
    return task_id


async def finished(client: httpx.AsyncClient, task_id: str, timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        task = (await client.get(f"/v1/tasks/{task_id}")).json()
        if task["status"] in ("succeeded", "failed", "cancelled"):
            return task
        await asyncio.sleep(0.2)
    raise AssertionError(f"{task_id} did not finish: {task}")


async def test_the_verifier_judges_what_the_agent_left_and_its_reward_is_the_tasks(
    fast: Settings, client: httpx.AsyncClient, scripted_llm: ScriptedLLMServer
) -> None:
    right = agent(scripted_llm, "ls -A /tests /logs/verifier", "echo 42 > output/answer.txt")
    wrong = agent(scripted_llm, "echo 41 > output/answer.txt")
    # Agents that plant a reward where the verifier writes its own: a file, a link to one
    # (never followed), a process that keeps writing one (killed first).
    planter = agent(
        scripted_llm,
        "mkdir -p /logs/verifier && echo '{\"reward\": 1}' > /logs/verifier/reward.json",
        "echo 41 > output/answer.txt",
    )
    linker = agent(
        scripted_llm,
        "mkdir -p /tmp/f && echo '{\"reward\": 1}' > /tmp/f/reward.json"
        " && rm -rf /logs/verifier && ln -s /tmp/f /logs/verifier",
        "echo 41 > output/answer.txt",
    )
    writer = agent(
        scripted_llm,
        "nohup sh -c 'while :; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.json;"
        " sleep 0.01; done' > /dev/null 2>&1 &",
        "echo 41 > output/answer.txt",
    )
    silent = agent(scripted_llm, "echo 42 > output/answer.txt")
    reply = scripted(scripted_llm, "vanilla", "42")
    async with running_worker(fast):
        ids = {
            "right": await submitted(client, prompt="p", llm={"model": right}, verifier=verifier()),
            "wrong": await submitted(client, prompt="p", llm={"model": wrong}, verifier=verifier()),
            "planter": await submitted(
                client, prompt="p", llm={"model": planter}, verifier=verifier()
            ),
            "linker": await submitted(
                client, prompt="p", llm={"model": linker}, verifier=verifier()
            ),
            "writer": await submitted(
                client, prompt="p", llm={"model": writer}, verifier=verifier()
            ),
            "silent": await submitted(
                client,
                prompt="p",
                llm={"model": silent},
                verifier=verifier("echo no reward here"),
            ),
            "vanilla": await submitted(
                client, prompt="p", mode="vanilla", llm={"model": reply}, verifier=verifier()
            ),
            "none": await submitted(client, prompt="p", llm={"model": silent}),
        }
        tasks = {key: await finished(client, task_id) for key, task_id in ids.items()}

    done = tasks["right"]
    assert done["status"] == "succeeded", done
    found = done["verification"]
    assert (found["reward"], found["rewards"], found["error"]) == (1.0, {"reward": 1.0}, None)
    assert (found["exit_code"], found["infrastructure"]) == (0, False)
    assert "checked by root in /tests; helper says 42" in found["stdout"]
    steps = (await client.get(f"/v1/tasks/{ids['right']}/trajectory")).json()["steps"]
    listing = steps[0]["observation"]
    assert "test.sh" not in listing, "the agent never sees the verifier's files"

    assert tasks["wrong"]["verification"]["reward"] == 0.0
    for planted in ("planter", "linker", "writer"):
        assert tasks[planted]["verification"]["reward"] == 0.0, (
            planted,
            tasks[planted]["verification"],
        )
    silent_found = tasks["silent"]["verification"]
    assert silent_found["reward"] is None
    assert "no reward file" in silent_found["error"]
    assert "no reward here" in silent_found["stdout"]
    assert not silent_found["infrastructure"]

    vanilla = tasks["vanilla"]
    assert (vanilla["mode"], vanilla["answer"]) == ("vanilla", "42")
    assert vanilla["verification"]["reward"] == 1.0, "the reply is the answer file it checks"
    assert tasks["none"]["verification"] is None


async def test_a_verifier_is_refused_with_every_problem_named(client: httpx.AsyncClient) -> None:
    bad = verifier(timeout_s=10**6)
    bad["files"].append({"path": "../escape.sh", "content_base64": "bm90IGJhc2U2NA=="})
    bad["files"].append({"path": "x.sh", "content_base64": "not base64!"})
    answer = await client.post("/v1/tasks", json={"prompt": "p", "verifier": bad})
    assert answer.status_code == 422, answer.text
    locs = {tuple(d["loc"]) for d in answer.json()["error"]["details"]}
    assert ("body", "verifier", "timeout_s") in locs
    assert ("body", "verifier", "files", 2, "path") in locs
    assert ("body", "verifier", "files", 3, "content_base64") in locs
    writable = await client.post(
        "/v1/tasks", json={"prompt": "p", "sandbox": {"read_only_rootfs": False}}
    )
    assert writable.status_code == 422, writable.text
    assert "SANDHIVE_SANDBOX_ALLOW_WRITABLE_ROOTFS" in writable.text


def harbor_row(row_id: str, script: str, **more: Any) -> dict[str, Any]:
    return {
        "id": row_id,
        "problem_statement": "Write 42 to the answer file.",
        "verifier": {"files": {"test.sh": script}, "timeout_s": 30},
        **more,
    }


async def test_an_experiment_scores_each_item_by_its_verifier_and_never_a_failure_as_zero(
    fast: Settings, client: httpx.AsyncClient, scripted_llm: ScriptedLLMServer
) -> None:
    model = agent(scripted_llm, "echo 42 > output/answer.txt")
    rows = [
        harbor_row("passes", "echo 1 > /logs/verifier/reward.txt"),
        harbor_row("fails", "echo '{\"reward\": 0}' > /logs/verifier/reward.json"),
        harbor_row("writes-nothing", "exit 3"),
        harbor_row("too-big", "echo 7 > /logs/verifier/reward.txt"),
    ]
    body = {
        "name": "verified",
        "dataset": {"rows": rows},
        "arms": [{"name": "s", "mode": "sandbox", "task": {"llm": {"model": model}}}],
        "scorer": {"kind": "verifier"},
    }
    async with running_worker(fast):
        url = await submit(client, body)
        await settled(client, url, "finished")
    items = {i["row_id"]: i for i in (await client.get(f"{url}/items")).json()["items"]}
    assert (items["passes"]["status"], items["passes"]["score"]) == ("scored", 1.0)
    assert (items["fails"]["status"], items["fails"]["score"]) == ("scored", 0.0)
    assert items["passes"]["answer"] == "42\n"
    # No reward, in the sandbox the agent left: the agent's 0 (it may have broken the
    # script's world), never an error left out of the mean.
    nothing = items["writes-nothing"]
    assert (nothing["status"], nothing["error_kind"], nothing["score"]) == ("scored", None, 0.0)
    assert "no reward file" in nothing["detail"]["message"]
    assert nothing["detail"]["exit_code"] == 3
    too_big = items["too-big"]
    assert (too_big["status"], too_big["error_kind"]) == ("error", "scorer")
    assert "outside [0, 1]" in too_big["detail"]["message"]
    results = (await client.get(f"{url}/results")).json()
    assert (results["arms"][0]["n"], results["arms"][0]["mean"]) == (3, pytest.approx(1 / 3))

    regrade = await client.post(f"{url}/regrade", json={"scorer": {"kind": "verifier"}})
    assert regrade.status_code == 422, regrade.text
    assert "own sandboxes" in regrade.text


async def test_an_experiments_rows_are_checked_for_their_verifier_and_image(
    client: httpx.AsyncClient,
) -> None:
    body = {
        "name": "bad",
        "dataset": {
            "rows": [
                {"id": "no-tests", "problem_statement": "p"},
                harbor_row("no-image", "exit 0", image="built/never-built"),
                harbor_row("slow", "exit 0")
                | {"verifier": {"files": {"t": ""}, "timeout_s": 10**7}},
            ]
        },
        "arms": [{"name": "s", "mode": "sandbox"}],
        "scorer": {"kind": "verifier"},
    }
    answer = await client.post("/v1/experiments", json=body)
    assert answer.status_code == 422, answer.text
    details = {tuple(d["loc"][1:]): d["msg"] for d in answer.json()["error"]["details"]}
    assert "needs the row's verifier" in details[("dataset", "rows", 0)]
    assert "not available" in details[("dataset", "rows", 1, "sandbox", "image")]
    assert "at most" in details[("dataset", "rows", 2, "verifier", "timeout_s")]


async def test_a_cancel_cuts_the_verifier_short(
    fast: Settings, client: httpx.AsyncClient, scripted_llm: ScriptedLLMServer
) -> None:
    """A cancel while the verifier runs ends the task `cancelled` at once, with no
    verification, as a cancel of the agent does."""
    model = agent(scripted_llm, "echo 42 > output/answer.txt")
    slow = verifier("sleep 60; echo 1 > /logs/verifier/reward.txt")
    async with running_worker(fast):
        task_id = await submitted(client, prompt="p", llm={"model": model}, verifier=slow)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the agent has submitted: the verifier runs
            steps = (await client.get(f"/v1/tasks/{task_id}/trajectory")).json()["steps"]
            if len(steps) == 2:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        asked = time.monotonic()
        assert (await client.post(f"/v1/tasks/{task_id}/cancel")).status_code == 202
        task = await finished(client, task_id, timeout_s=30)
        took = time.monotonic() - asked
    assert (task["status"], task["verification"]) == ("cancelled", None), task
    assert took < 20, f"the cancel waited {took:.0f} s for the verifier"
