"""An ended episode as ATIF, with a real worker: its steps are written once as it ends, the
document validates with the real `harbor` package's models (tests/support/harbor.py), and an
open episode's trajectory is a 409, another tenant's a 404."""

from __future__ import annotations

import httpx

from tests.api.conftest import assert_error
from tests.episodes.conftest import ALICE, BOB, SUBMIT, open_episode, step, write_answer
from tests.support.harbor import atif_problems
from tests.support.zygote import AppProcess


async def test_an_ended_episode_exports_as_atif_that_harbor_validates(
    worker: AppProcess, api: httpx.AsyncClient
) -> None:
    opened = await open_episode(
        api, prompt="What is 6 x 7?", scorer={"kind": "exact"}, ground_truth="42"
    )
    url = f"/v1/episodes/{opened['id']}/trajectory"
    assert_error(await api.get(url, headers=ALICE), 409, "conflict")  # still open
    assert (await step(api, opened["id"], write_answer("42"))).status_code == 200
    assert (await step(api, opened["id"], SUBMIT)).json()["done"] is True

    answer = await api.get(url, headers=ALICE)
    assert answer.status_code == 200, answer.text
    trajectory = answer.json()
    assert atif_problems([trajectory]) == [None]
    assert trajectory["session_id"] == opened["id"]
    steps = trajectory["steps"]
    assert [s["source"] for s in steps] == ["user", "agent", "agent"]
    assert steps[0]["message"] == "What is 6 x 7?"
    edit, submit = steps[1], steps[2]
    assert edit["tool_calls"][0]["function_name"] == "str_replace_editor"
    assert edit["tool_calls"][0]["arguments"]["file_text"] == "42"
    assert "created" in edit["observation"]["results"][0]["content"].lower()
    assert submit["tool_calls"][0]["function_name"] == "submit"
    extra = trajectory["extra"]
    assert (extra["episode_id"], extra["finish_reason"], extra["answer"]) == (
        opened["id"],
        "submitted",
        "42",
    )
    assert "task_id" not in extra
    assert trajectory["final_metrics"]["total_steps"] == 3
    assert_error(await api.get(url, headers=BOB), 404, "not_found")
    assert_error(await api.get(f"{url}?format=json", headers=ALICE), 422, "invalid_input")
