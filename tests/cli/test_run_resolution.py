"""`sandhive run` resolves its options exactly as the API resolves a submission."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from typer.testing import CliRunner

from app.api.app import create_app
from app.cli.main import cli
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.errors import InvalidInput
from app.runner.local import resolve_run
from app.specs import read_spec
from tests.api.conftest import serve

# Server defaults that differ from every built-in one: a path that ignored them would show.
SERVER_DEFAULTS = {
    "default_max_steps": 7,
    "default_timeout_s": 777,
    "default_command_timeout_s": 33,
    "default_max_context_tokens": 5000,
    "default_temperature": 0.3,
    "default_max_tokens_per_call": 999,
    "default_cpus": 0.5,
    "default_memory_mb": 300,
    "default_disk_mb": 40,
    "answer_all_tool_calls": False,
    "max_max_steps": 50,
}
OPTIONS_CASES = [
    {"prompt": "p"},
    {
        "prompt": "p",
        "llm": {"model": "other", "temperature": 0.9},
        "limits": {"max_steps": 3, "command_timeout_s": 5},
        "tools": {"profile": "reference"},
        "prompt_config": "math",
    },
    {"prompt": "p", "tools": {"profile": "standard", "shell": "persistent"}},
]


@pytest.fixture
def odd_settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(**SERVER_DEFAULTS)


@pytest.mark.parametrize("options", OPTIONS_CASES)
async def test_a_local_run_and_a_submission_resolve_to_the_same_spec(
    odd_settings: Settings, sessions: Sessions, options: dict[str, object]
) -> None:
    async with serve(create_app(odd_settings)) as api:
        response = await api.post("/v1/tasks", json=options)
    assert response.status_code == 202, response.text
    async with sessions() as session:
        row = await session.get_one(models.Task, response.json()["id"])
    submitted = read_spec(row.spec)
    local = resolve_run(odd_settings, options)
    assert local == submitted
    if options == {"prompt": "p"}:  # the server's defaults, not the run command's own
        assert (local.limits.max_steps, local.limits.timeout_s) == (7, 777)
        assert (local.llm.temperature, local.sandbox.disk_mb) == (0.3, 40)
        assert local.tools.answer_all_tool_calls is False


async def test_a_local_run_and_a_submission_refuse_the_same_options_alike(
    odd_settings: Settings,
) -> None:
    bad = {"prompt": "p", "limits": {"max_steps": 51}, "llm": {"profile": "nope"}}
    async with serve(create_app(odd_settings)) as api:
        response = await api.post("/v1/tasks", json=bad)
    assert response.status_code == 422
    refused = response.json()["error"]
    with pytest.raises(InvalidInput) as caught:
        resolve_run(odd_settings, bad)
    assert caught.value.message == refused["message"]
    assert caught.value.details == refused["details"]


def test_the_run_command_refuses_a_value_over_the_server_maximum(
    odd_settings: Settings,
) -> None:
    env = {"SANDHIVE_MAX_MAX_STEPS": "50", "SANDHIVE_LLM_MODEL": "m"}
    args = ["run", "--prompt", "p", "--base-url", "http://127.0.0.1:9/v1", "--max-steps", "51"]
    done = CliRunner().invoke(cli, args, env=env)
    assert done.exit_code == 2, done.output
    assert "limits.max_steps: must be at most 50" in done.output


async def test_the_api_shows_the_resolved_tools_of_a_row_from_the_first_release(
    odd_settings: Settings, sessions: Sessions
) -> None:
    """The first release stored `tools` as just its profile: read as that profile's policy."""
    async with serve(create_app(odd_settings)) as api:
        task_id = (await api.post("/v1/tasks", json={"prompt": "p"})).json()["id"]
        async with sessions.begin() as session:
            row = await session.get_one(models.Task, task_id)
            row.spec = {**row.spec, "tools": {"profile": "reference"}, "added_later": {"x": 1}}
        shown: httpx.Response = await api.get(f"/v1/tasks/{task_id}")
    assert shown.json()["tools"] == {
        "profile": "reference",
        "answer_all_tool_calls": False,
        "shell": "fresh",
    }
