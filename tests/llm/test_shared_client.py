"""The worker's one HTTP client for every task's model calls (`transport.shared_http_client`)."""

from __future__ import annotations

import httpx
from pydantic import SecretStr

from app.config import LLMProfile
from app.llm.profiles import model_for_profile
from app.llm.transport import shared_http_client
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.llm.support import TOOLS, USER


async def test_tasks_share_connections_and_models_never_close_the_shared_client(
    llm_server: ScriptedLLMServer,
) -> None:
    llm_server.add_script("shared", Script([Turn("submit", {})], repeat_last=True))
    profile = LLMProfile(base_url=llm_server.base_url, api_key=SecretStr("k"))
    async with shared_http_client() as client:
        for _ in range(3):  # three tasks, one after the other
            model = model_for_profile(
                profile, model="shared", temperature=None, max_tokens=64, client=client
            )
            done = await model.complete(USER, TOOLS)
            assert done.tool_calls[0].name == "submit"
            await model.aclose()
            assert not client.is_closed, "a task's model must not close the worker's client"
        pool = client._transport._pool  # type: ignore[attr-defined]
        assert len(pool.connections) == 1, "the three tasks reused one kept-alive connection"


async def test_cookies_set_by_an_endpoint_are_never_kept() -> None:
    async with shared_http_client() as client:
        request = httpx.Request("POST", "https://llm.example/v1/chat/completions")
        response = httpx.Response(
            200, headers={"set-cookie": "lb=tenant-a; Path=/"}, request=request
        )
        client.cookies.extract_cookies(response)
        assert len(client.cookies) == 0


async def test_streamed_answers_are_read_to_their_end_and_their_connection_kept(
    llm_server: ScriptedLLMServer,
) -> None:
    """The agent loop streams every model call: reading past `[DONE]` to the response's end
    returns the connection to the pool, so a task's steps share one instead of opening one
    (a TCP and, to a provider, a TLS handshake) per step."""
    llm_server.add_script("streamed", Script([Turn("submit", {})], repeat_last=True))
    profile = LLMProfile(base_url=llm_server.base_url, api_key=SecretStr("k"))

    async def on_delta(kind: str, fragment: str) -> None:
        """Given, so the model streams (as the agent loop always has it do)."""

    async with shared_http_client() as client:
        model = model_for_profile(
            profile, model="streamed", temperature=None, max_tokens=64, client=client
        )
        for _ in range(3):
            done = await model.complete(USER, TOOLS, on_delta)
            assert done.tool_calls[0].name == "submit"
        await model.aclose()
        pool = client._transport._pool  # type: ignore[attr-defined]
        assert len(pool.connections) == 1, "three streamed answers over one kept-alive connection"
        assert llm_server.book.requests["streamed"] == 3
        sent = llm_server.book.last_request("streamed")
        assert sent is not None
        assert sent["stream"] is True, "the answers were streamed"
