"""The agent's options over the API: prompt configs, provider profiles, the multi-call setting,
the reference trajectory format and the skipped-artifacts marker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from app.api.app import create_app
from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from tests.api.conftest import assert_error, serve
from tests.support.rows import insert_step, insert_task

PROFILES_TOML = """
[profiles.claude]
kind = "anthropic"
base_url = "http://127.0.0.1:9/v1"
api_key = "sk-ant-secret"
model = "claude-sonnet"
models = ["claude-sonnet", "claude-haiku"]
"""


@pytest.fixture
def agent_settings(make_settings: Callable[..., Settings], tmp_path: Path) -> Settings:
    (tmp_path / "profiles.toml").write_text(PROFILES_TOML)
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "mine.yaml").write_text(
        "system_prompt: 'Solve it in {working_dir}.'\n"
        "instance_prompt: '{problem_statement}'\n"
        "input_dir: /testbed/documents\n"
        "output_dir: /testbed\n"
    )
    (prompts / "stray.yaml").write_text("system_prompt: 'JSON like {a: 1}'\n")
    return make_settings(llm_profiles_file=tmp_path / "profiles.toml", prompt_configs_dir=prompts)


@pytest.fixture
async def api(agent_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(create_app(agent_settings)) as client:
        yield client


async def submit(api: httpx.AsyncClient, **fields: object) -> httpx.Response:
    return await api.post("/v1/tasks", json={"prompt": "p", **fields})


async def test_prompt_configs_by_name_from_files_and_as_a_custom_pair(
    api: httpx.AsyncClient,
) -> None:
    task = (await submit(api)).json()
    assert task["prompt_config"] == "general"
    domain = await submit(api, prompt_config="long_context")
    assert domain.status_code == 202, domain.text
    assert domain.json()["prompt_config"] == "long_context"
    from_file = await submit(api, prompt_config="mine")
    assert from_file.json()["prompt_config"] == "mine"
    custom = await submit(
        api, prompt_config={"system": "Be brief.", "instance": "{problem_statement}"}
    )
    assert custom.status_code == 202, custom.text
    assert custom.json()["prompt_config"] == "custom"


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ("nope", "unknown prompt_config 'nope'; known: biomed, chem, general, "),
        ("stray", "system template does not format"),
        ({"system": "s", "instance": "{question}"}, "instance template does not format"),
        ({"system": "s", "output_dir": "/etc"}, "output_dir must be"),
        ("custom", "reserved"),
    ],
)
async def test_bad_prompt_configs_are_refused_at_submit(
    api: httpx.AsyncClient, choice: object, message: str
) -> None:
    error = assert_error(await submit(api, prompt_config=choice), 422, "invalid_input")
    assert message in error["message"]
    assert error["details"][0]["loc"] == ["body", "prompt_config"]


@pytest.mark.parametrize("choice", ["../etc/passwd", "a/b", "", {"instance": "no system"}])
async def test_malformed_prompt_config_values_fail_validation(
    api: httpx.AsyncClient, choice: object
) -> None:
    assert_error(await submit(api, prompt_config=choice), 422, "invalid_input")


async def test_a_profile_names_its_kind_and_allows_only_its_models(
    api: httpx.AsyncClient,
) -> None:
    ok = await submit(api, llm={"profile": "claude", "model": "claude-haiku"})
    assert ok.status_code == 202, ok.text
    assert ok.json()["llm"]["model"] == "claude-haiku"
    assert "sk-ant-secret" not in ok.text
    default = await submit(api, llm={"profile": "claude"})
    assert default.json()["llm"]["model"] == "claude-sonnet"

    error = assert_error(
        await submit(api, llm={"profile": "claude", "model": "gpt-4o"}), 422, "invalid_input"
    )
    said = "model 'gpt-4o' is not allowed by llm profile 'claude'"
    said += "; allowed: claude-haiku, claude-sonnet"
    assert said in error["message"]
    assert error["details"][0]["allowed"] == ["claude-haiku", "claude-sonnet"]
    # The default profile lists no models: any model is allowed.
    assert (await submit(api, llm={"model": "anything"})).status_code == 202


async def test_the_multi_call_setting_is_resolved_per_profile(api: httpx.AsyncClient) -> None:
    async def answer_all(tools: dict[str, object]) -> object:
        return (await submit(api, tools=tools)).json()["tools"]["answer_all_tool_calls"]

    assert await answer_all({}) is True
    assert await answer_all({"profile": "reference"}) is False
    assert await answer_all({"profile": "reference", "answer_all_tool_calls": True}) is True
    assert await answer_all({"answer_all_tool_calls": False}) is False


async def test_the_server_default_of_the_multi_call_setting(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(answer_all_tool_calls=True)
    async with serve(create_app(settings)) as client:
        task = await submit(client, tools={"profile": "reference"})
    assert task.json()["tools"] == {
        "profile": "reference",
        "answer_all_tool_calls": True,
        "shell": "fresh",
    }


async def test_a_persistent_shell_is_a_standard_only_option(api: httpx.AsyncClient) -> None:
    kept = await submit(api, tools={"shell": "persistent"})
    assert kept.status_code == 202, kept.text
    assert kept.json()["tools"]["shell"] == "persistent"
    assert (await submit(api)).json()["tools"]["shell"] == "fresh"

    error = assert_error(
        await submit(api, tools={"profile": "reference", "shell": "persistent"}),
        422,
        "invalid_input",
    )
    assert error["details"][0]["loc"] == ["body", "tools", "shell"]
    assert "reference profile runs a fresh shell" in error["details"][0]["msg"]
    assert_error(await submit(api, tools={"shell": "sticky"}), 422, "invalid_input")


async def test_a_persistent_shell_needs_the_exec_channel(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(sandbox_exec_channel=False)
    async with serve(create_app(settings)) as client:
        error = assert_error(
            await submit(client, tools={"shell": "persistent"}), 422, "invalid_input"
        )
        assert error["details"][0]["loc"] == ["body", "tools", "shell"]
        assert (await submit(client)).status_code == 202


async def test_stored_specs_stay_readable_by_the_previous_release(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    """The release before the persistent shell parsed `tools` with exactly these keys and
    refused any other (docs/operations.md, "Upgrades": old and new processes overlap)."""
    previous_release_keys = {"profile", "answer_all_tool_calls"}
    fresh = (await submit(api)).json()["id"]
    kept = (await submit(api, tools={"shell": "persistent"})).json()["id"]
    async with sessions() as session:
        rows = {
            task_id: (await session.get_one(models.Task, task_id)).spec["tools"]
            for task_id in (fresh, kept)
        }
    assert set(rows[fresh]) == previous_release_keys
    assert rows[kept]["shell"] == "persistent"  # only a task that needs the new option
    assert (await api.get(f"/v1/tasks/{fresh}")).json()["tools"]["shell"] == "fresh"


async def test_the_reference_trajectory_format(api: httpx.AsyncClient, sessions: Sessions) -> None:
    task_id = await insert_task(sessions, prompt="Compute it.", attempt=2)
    for attempt, index in ((1, 0), (2, 0), (2, 1)):
        await insert_step(sessions, task_id, attempt, index)

    latest = (await api.get(f"/v1/tasks/{task_id}/trajectory?format=reference")).json()
    assert latest["problem_statement"] == "Compute it."
    assert latest["metadata"] == {"total_steps": 2}
    # The package numbers steps from 1 (agent.py: "step": step_count + 1): our index i is its i + 1.
    assert [s["metadata"]["step"] for s in latest["steps"]] == [1, 2]
    assert latest["steps"][1] == {
        "thought": "thought 2.1",
        "reasoning_content": "",
        "action": {"function": "execute_bash", "parameters": {"command": "echo 1"}},
        "observation": "1\n",
        "metadata": {"step": 2, "exec_time": 0.005},
    }
    first = await api.get(f"/v1/tasks/{task_id}/trajectory?format=reference&attempt=1")
    assert [s["thought"] for s in first.json()["steps"]] == ["thought 1.0"]
    ours = (await api.get(f"/v1/tasks/{task_id}/trajectory")).json()
    assert len(ours["steps"]) == 3
    bad = await api.get(f"/v1/tasks/{task_id}/trajectory?format=xml")
    assert_error(bad, 422, "invalid_input")
    missing = await api.get("/v1/tasks/tsk_nope/trajectory?format=reference")
    assert_error(missing, 404, "not_found")


async def test_skipped_output_files_are_marked_on_the_task_and_the_artifact_list(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    skipped = [{"path": "big.bin", "reason": "larger than 10 bytes"}]
    task_id = await insert_task(sessions, artifacts_skipped=skipped)
    assert (await api.get(f"/v1/tasks/{task_id}")).json()["artifacts_skipped"] == skipped
    listing = (await api.get(f"/v1/tasks/{task_id}/artifacts")).json()
    assert listing == {"items": [], "skipped": skipped}
    clean = await insert_task(sessions)
    assert (await api.get(f"/v1/tasks/{clean}")).json()["artifacts_skipped"] == []
