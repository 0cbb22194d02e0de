"""`llm.base_url` and `llm.capture` at submit time, without a worker: a base URL outside
the operator's allow-list is a 422 naming the setting (nothing stored), an allowed one is
stored resolved, capture on a non-OpenAI profile is a 422, an experiment arm is checked
the same way, and the new settings parse from the environment's comma lists."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from app.api.app import create_app
from app.config import Settings
from app.db.engine import Sessions
from tests.api.conftest import assert_error, serve
from tests.support.experiments import counts, experiment

TRAINER = "http://10.0.0.7:8000/v1"


def task(**llm: Any) -> dict[str, Any]:
    return {"prompt": "hi", "llm": llm}


async def test_no_base_url_is_allowed_by_default(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    answer = await client.post("/v1/tasks", json=task(base_url=TRAINER))
    error = assert_error(answer, 422, "invalid_input")
    (detail,) = error["details"]
    assert detail["loc"] == ["body", "llm", "base_url"]
    assert "SANDHIVE_LLM_ALLOWED_BASE_URLS" in detail["msg"]
    assert await counts(sessions) == (0, 0, 0)


async def test_only_listed_base_urls_pass(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = make_settings(llm_allowed_base_urls=f"{TRAINER}/,http://10.0.0.8:8000/v1")
    assert settings.llm_allowed_base_urls == [f"{TRAINER}/", "http://10.0.0.8:8000/v1"]
    async with serve(create_app(settings)) as client:
        refused = await client.post("/v1/tasks", json=task(base_url="http://169.254.169.254/v1"))
        detail = assert_error(refused, 422, "invalid_input")["details"][0]
        assert "not in SANDHIVE_LLM_ALLOWED_BASE_URLS" in detail["msg"]
        assert await counts(sessions) == (0, 0, 0)
        accepted = await client.post("/v1/tasks", json=task(base_url=TRAINER, capture=True))
        assert accepted.status_code == 202, accepted.text
        llm = accepted.json()["llm"]
        assert (llm["base_url"], llm["capture"]) == (TRAINER, True)


async def test_a_task_without_the_options_is_stored_as_before(client: httpx.AsyncClient) -> None:
    accepted = await client.post("/v1/tasks", json=task())
    assert accepted.status_code == 202, accepted.text
    llm = accepted.json()["llm"]
    assert (llm["base_url"], llm["capture"]) == (None, False)


async def test_capture_needs_an_openai_compatible_profile(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    toml = tmp_path / "profiles.toml"
    toml.write_text(
        '[profiles.claude]\nkind = "anthropic"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "c"\n'
    )
    async with serve(create_app(make_settings(llm_profiles_file=toml))) as client:
        answer = await client.post("/v1/tasks", json=task(profile="claude", capture=True))
        detail = assert_error(answer, 422, "invalid_input")["details"][0]
        assert detail["loc"] == ["body", "llm", "capture"]


async def test_an_experiment_arm_is_checked_like_a_task(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    arms = [{"name": "a"}, {"name": "b", "task": {"llm": {"base_url": TRAINER}}}]
    answer = await client.post("/v1/experiments", json=experiment(arms=arms))
    error = assert_error(answer, 422, "invalid_input")
    assert error["details"][0]["loc"] == ["body", "arms", 1, "task", "llm", "base_url"]
    assert await counts(sessions) == (0, 0, 0)


async def test_capture_must_be_a_boolean(client: httpx.AsyncClient) -> None:
    answer = await client.post("/v1/tasks", json=task(capture="yes"))
    assert_error(answer, 422, "invalid_input")
