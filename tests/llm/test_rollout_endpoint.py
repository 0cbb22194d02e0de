"""A rollout's own model server gets the rollout key and the session header; a provider's
profile keeps its key and never hears the task id unless the profile asks for it.

An allowed `llm.base_url` swaps the profile's URL, so without care the profile's key
would go with it: any tenant could point a provider's profile at a server it can read.
Real HTTP to the scripted server (`Runner.model` builds the client as the worker does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.config import Settings
from app.runner.episode import Runner
from app.sandbox import DockerHost
from app.scripted import Script, ScriptedLLMServer, Turn
from app.specs import LLMSpec
from tests.llm.support import TOOLS, USER, register

PROVIDER_KEY = "sk-provider-secret"
ROLLOUT_KEY = "rollout-key"


def settings_for(server: ScriptedLLMServer, **extra: Any) -> Settings:
    return Settings(
        _env_file=None,
        llm_base_url=server.base_url,
        llm_api_key=PROVIDER_KEY,
        llm_model="m",
        llm_allowed_base_urls=[server.base_url],
        **extra,
    )


async def headers_of_one_call(
    server: ScriptedLLMServer,
    settings: Settings,
    base_url: str | None,
    profile: str = "default",
) -> dict[str, str]:
    name = register(server, Script([Turn("submit")]))
    spec = LLMSpec(
        profile=profile,
        model=name,
        temperature=0.0,
        max_tokens_per_call=64,
        base_url=base_url,
    )
    model = Runner(settings, DockerHost()).model(spec, session="task_abc")
    try:
        await model.complete(USER, TOOLS, None)
    finally:
        await model.aclose()
    headers = server.last_headers(name)
    assert headers is not None
    return headers


async def test_a_rollouts_own_server_never_gets_the_profiles_key(
    llm_server: ScriptedLLMServer,
) -> None:
    plain = settings_for(llm_server)
    headers = await headers_of_one_call(llm_server, plain, llm_server.base_url)
    assert "authorization" not in headers, "no rollout key set: none is sent"
    assert headers["x-session-id"] == "task_abc"
    keyed = settings_for(llm_server, llm_rollout_api_key=ROLLOUT_KEY)
    headers = await headers_of_one_call(llm_server, keyed, llm_server.base_url)
    assert headers["authorization"] == f"Bearer {ROLLOUT_KEY}"


async def test_a_providers_profile_keeps_its_key_and_not_the_task_id(
    llm_server: ScriptedLLMServer,
) -> None:
    headers = await headers_of_one_call(llm_server, settings_for(llm_server), None)
    assert headers["authorization"] == f"Bearer {PROVIDER_KEY}"
    assert "x-session-id" not in headers, "the task id is not a provider's business"


async def test_a_profile_for_a_trainers_router_may_ask_for_the_session_header(
    llm_server: ScriptedLLMServer, tmp_path: Path
) -> None:
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(
        f'[profiles.router]\nbase_url = "{llm_server.base_url}"\nsession_header = true\n'
    )
    settings = settings_for(llm_server, llm_profiles_file=profiles)
    headers = await headers_of_one_call(llm_server, settings, None, profile="router")
    assert headers["x-session-id"] == "task_abc"
