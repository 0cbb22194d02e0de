"""`GET /v1/llm/profiles`, the 422 of an unknown profile, and validation messages that say why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx

from app.api.app import create_app
from app.config import NO_MODEL_NOTICE, SCRIPTED_ONLY_NOTICE, Settings
from app.db.engine import Sessions
from app.services import keys
from tests.api.conftest import assert_error, serve


async def test_profiles_lists_names_formats_models_and_never_urls_or_keys(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    toml = tmp_path / "profiles.toml"
    toml.write_text(
        '[profiles.claude]\nkind = "anthropic"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'api_key = "sk-secret"\nmodel = "claude-x"\nmodels = ["claude-x", "claude-y"]\n'
        "input_price_per_mtok = 3.0\noutput_price_per_mtok = 15.0\n"
    )
    settings = make_settings(scripted_profile=True, llm_profiles_file=toml, llm_api_key="sk-d")
    async with serve(create_app(settings)) as client:
        response = await client.get("/v1/llm/profiles")
    assert response.status_code == 200, response.text
    assert "sk-" not in response.text, "no key"
    assert "127.0.0.1" not in response.text, "no URL"
    body = response.json()
    assert body["notice"] is None, "a real model is configured"
    by_name = {p["name"]: p for p in body["profiles"]}
    assert [p["name"] for p in body["profiles"]] == ["default", "claude", "scripted"]
    assert by_name["default"] == {
        "name": "default",
        "kind": "openai",
        "model": "test-model",
        "models": [],
        "scripted": False,
        "input_price_per_mtok": None,
        "output_price_per_mtok": None,
    }
    assert by_name["claude"]["kind"] == "anthropic"
    assert by_name["claude"]["models"] == ["claude-x", "claude-y"]
    assert (
        by_name["claude"]["input_price_per_mtok"],
        by_name["claude"]["output_price_per_mtok"],
    ) == (
        3.0,
        15.0,
    )
    assert by_name["scripted"]["scripted"] is True
    assert (by_name["scripted"]["model"], by_name["scripted"]["models"]) == (
        "demo",
        ["demo", "tour"],
    )


async def test_profiles_say_what_to_set_when_no_real_model_is_configured(
    make_settings: Callable[..., Settings],
) -> None:
    for extra, names, notice in (
        ({}, [], NO_MODEL_NOTICE),
        ({"scripted_profile": True}, ["scripted"], SCRIPTED_ONLY_NOTICE),
    ):
        async with serve(create_app(make_settings(llm_base_url="", **extra))) as client:
            body = (await client.get("/v1/llm/profiles")).json()
        assert [p["name"] for p in body["profiles"]] == names
        assert body["notice"] == notice
    assert "SANDHIVE_LLM_BASE_URL" in NO_MODEL_NOTICE
    assert "SANDHIVE_SCRIPTED_PROFILE=true" in NO_MODEL_NOTICE


async def test_profiles_need_a_key_like_every_v1_route(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    created = await keys.create_key(sessions, "tenant-a")
    async with serve(create_app(make_settings(auth="keys"))) as client:
        assert_error(await client.get("/v1/llm/profiles"), 401, "unauthorized")
        wrong = {"Authorization": "Bearer shv_not-a-key"}
        assert_error(await client.get("/v1/llm/profiles", headers=wrong), 401, "unauthorized")
        good = {"Authorization": f"Bearer {created.key}"}
        response = await client.get("/v1/llm/profiles", headers=good)
    assert response.status_code == 200, response.text
    assert [p["name"] for p in response.json()["profiles"]] == ["default"]


async def test_an_unknown_profile_422_lists_the_available_ones(
    make_settings: Callable[..., Settings],
) -> None:
    body = {"prompt": "x", "llm": {"profile": "gpt"}}
    async with serve(create_app(make_settings(scripted_profile=True))) as client:
        error = assert_error(await client.post("/v1/tasks", json=body), 422, "invalid_input")
    assert (
        error["message"] == "llm.profile: unknown llm profile 'gpt'; available: default, scripted"
    )
    assert error["details"][0]["loc"] == ["body", "llm", "profile"]
    assert error["details"][0]["available"] == ["default", "scripted"]


async def test_an_unknown_profile_with_none_configured_says_what_to_set(
    make_settings: Callable[..., Settings],
) -> None:
    async with serve(create_app(make_settings(llm_base_url=""))) as client:
        response = await client.post("/v1/tasks", json={"prompt": "x"})
    error = assert_error(response, 422, "invalid_input")
    assert "unknown llm profile 'default'; none is configured" in error["message"]
    assert "SANDHIVE_SCRIPTED_PROFILE=true" in error["message"]


async def test_on_a_scripted_only_server_a_task_naming_no_profile_runs_scripted(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # What `make run` configures before a real model is: the scripted profile alone.
    settings = make_settings(scripted_profile=True, llm_base_url="", llm_model="")
    async with serve(create_app(settings)) as client:
        plain = await client.post("/v1/tasks", json={"prompt": "x"})
        named = await client.post("/v1/tasks", json={"prompt": "x", "llm": {"profile": "default"}})
        other = await client.post("/v1/tasks", json={"prompt": "x", "llm": {"model": "tour"}})
    assert plain.status_code == 202, plain.text
    assert plain.json()["llm"]["profile"] == "scripted"
    assert plain.json()["llm"]["model"] == "demo"
    assert other.json()["llm"] == {**other.json()["llm"], "profile": "scripted", "model": "tour"}
    # A task that names a profile gets that one or a 422, never another.
    assert (
        "unknown llm profile 'default'; available: scripted"
        in assert_error(named, 422, "invalid_input")["message"]
    )
    # With any other profile configured, naming none still means `default`.
    toml = tmp_path / "profiles.toml"
    toml.write_text('[profiles.claude]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "c"\n')
    with_file = make_settings(scripted_profile=True, llm_base_url="", llm_profiles_file=toml)
    async with serve(create_app(with_file)) as client:
        refused = await client.post("/v1/tasks", json={"prompt": "x"})
    assert (
        "unknown llm profile 'default'; available: claude, scripted"
        in assert_error(refused, 422, "invalid_input")["message"]
    )


async def test_the_validation_message_names_the_first_problem(client: httpx.AsyncClient) -> None:
    body = {"prompt": "x", "limits": {"max_steps": 0, "timeout_s": 0}}
    error = assert_error(await client.post("/v1/tasks", json=body), 422, "invalid_input")
    assert error["message"] == (
        "limits.max_steps: Input should be greater than or equal to 1 (and 1 more)"
    )
    assert [d["loc"] for d in error["details"]] == [
        ["body", "limits", "max_steps"],
        ["body", "limits", "timeout_s"],
    ]
    missing = assert_error(await client.post("/v1/tasks", json={}), 422, "invalid_input")
    assert missing["message"] == "prompt: Field required"
