"""GET /v1/experiments/{id}/results?format=package: per arm, the reference package's
results.json (its config, total, mean_score with errors as 0, num_errors, elapsed time)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import select, update

from app.api.app import create_app
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.resources import open_resources
from app.services.experiments import runner as experiment_runner
from tests.api.conftest import assert_error, serve
from tests.support.experiments import experiment

# row -> (arm a's answer, arm b's answer); ground truths 2, 4, 6; None: no answer (an error)
ANSWERS = {"q1": ("\\boxed{2}", "\\boxed{2}"), "q2": ("\\boxed{4}", "5"), "q3": (None, "7")}
ARM_ANSWER = {"a": 0, "b": 1, "c": 0}
ROLLOUT_URL = "http://127.0.0.1:9/trainer/v1"
"""A rollout server the arm names itself (allowed by the operator): the tenant's to see."""
PACKAGE_KEYS = {"config", "task", "total", "mean_score", "num_errors", "elapsed_time_seconds"}
CONFIG_KEYS = {
    "mode",
    "docker_image",
    "llm_name",
    "llm_base_url",
    "max_steps",
    "temperature",
    "max_token_limit",
    "max_tokens_per_call",
    "max_response_len",
    "extra_body",
    "save_litellm_response",
}


async def end_tasks(sessions: Sessions, exp_id: str) -> None:
    """Every item's task succeeds with the answer the table above gives it."""
    async with sessions.begin() as session:
        started = await session.execute(
            select(models.ExperimentItem.row_id, models.ExperimentItem.arm, models.Task.id).join(
                models.Task, models.Task.id == models.ExperimentItem.task_id
            )
        )
        for row_id, arm, task_id in started:
            answer = ANSWERS[row_id][ARM_ANSWER[arm]]
            await session.execute(
                update(models.Task)
                .where(models.Task.id == task_id)
                .values(status="succeeded", finish_reason="submitted", answer=answer)
            )


async def test_each_arm_as_the_package_reports_it(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = make_settings(
        llm_base_url="http://me:secret@127.0.0.1:9/v1?key=hidden#x",
        llm_allowed_base_urls=[ROLLOUT_URL],
    )
    arms = [
        {"name": "a", "task": {"limits": {"max_steps": 5}, "llm": {"temperature": 0.7}}},
        {"name": "b", "mode": "vanilla", "task": {"llm": {"max_tokens_per_call": 300}}},
        {"name": "c", "task": {"llm": {"base_url": ROLLOUT_URL}}},
    ]
    async with serve(create_app(settings)) as client:
        created = await client.post(
            "/v1/experiments", json=experiment(name="math", arms=arms, concurrency=9)
        )
        assert created.status_code == 202, created.text
        exp_id = created.json()["id"]
        await end_tasks(sessions, exp_id)
        async with open_resources(settings) as res:
            await experiment_runner.advance_all(res.sessions, res.redis, settings)
        answer = await client.get(f"/v1/experiments/{exp_id}/results?format=package")
        ours = (await client.get(f"/v1/experiments/{exp_id}/results")).json()
        regrade = await client.post(
            f"/v1/experiments/{exp_id}/regrade", json={"scorer": {"kind": "exact"}}
        )
        assert regrade.status_code == 202, regrade.text
        url = f"/v1/experiments/{exp_id}/results"
        regrading = (await client.get(url, params={"format": "package"})).json()
        first = (await client.get(url, params={"format": "package", "grading": 1})).json()
        never = await client.get(url, params={"format": "package", "grading": 3})
    assert_error(never, 422, "invalid_input")
    assert [arm["total"] for arm in regrading["arms"].values()] == [1, 0, 1], (
        "being scored again: only the error, with no answer to score, has ended"
    )
    for arm in ("a", "b"):
        outcome = ("total", "mean_score", "num_errors")
        was = {key: answer.json()["arms"][arm][key] for key in outcome}
        assert {key: first["arms"][arm][key] for key in outcome} == was, "grading 1 kept"
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) == {"arms"}
    a, b = body["arms"]["a"], body["arms"]["b"]
    assert set(a) == set(b) == PACKAGE_KEYS
    assert set(a["config"]) == set(b["config"]) == CONFIG_KEYS
    assert (a["task"], a["total"], a["num_errors"]) == ("math", 3, 1)
    assert a["mean_score"] == pytest.approx(2 / 3), "the error counts as 0, as in the package"
    assert ours["arms"][0]["mean"] == 1.0, "while /results leaves errors out"
    assert (b["total"], b["num_errors"], b["mean_score"]) == (3, 0, pytest.approx(1 / 3))
    assert a["elapsed_time_seconds"] >= 0
    assert a["config"] == {
        "mode": "llm-in-sandbox",
        "docker_image": "sandhive-sandbox:test",
        "llm_name": "test-model",
        "llm_base_url": None,
        "max_steps": 5,
        "temperature": 0.7,
        "max_token_limit": settings.default_max_context_tokens,
        "max_tokens_per_call": settings.default_max_tokens_per_call,
        "max_response_len": None,
        "extra_body": {},
        "save_litellm_response": False,
    }
    assert b["config"] | {"temperature": None} == {
        "mode": "llm",
        "docker_image": None,
        "llm_name": "test-model",
        "llm_base_url": None,
        "max_steps": None,
        "temperature": None,
        "max_token_limit": None,
        "max_tokens_per_call": 300,
        "max_response_len": 300,
        "extra_body": {},
        "save_litellm_response": False,
    }
    assert body["arms"]["c"]["config"]["llm_base_url"] == ROLLOUT_URL
    assert "secret" not in answer.text
    assert "hidden" not in answer.text


async def test_an_arm_with_no_task_yet_is_described_from_its_options(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    arms = [{"name": "a"}, {"name": "late", "mode": "vanilla"}]
    async with serve(create_app(settings)) as client:
        created = await client.post("/v1/experiments", json=experiment(arms=arms, concurrency=1))
        url = f"/v1/experiments/{created.json()['id']}/results"
        body = (await client.get(url, params={"format": "package"})).json()
        assert_error(await client.get(url, params={"format": "csv"}), 422, "invalid_input")
        assert_error(await client.get(url, params={"fromat": "package"}), 422, "invalid_input")
    late = body["arms"]["late"]
    assert (late["total"], late["mean_score"], late["num_errors"]) == (0, 0.0, 0)
    assert (late["config"]["mode"], late["config"]["llm_name"]) == ("llm", "test-model")
