"""`sandhive mcp` driven by the MCP SDK's own client, against a real running Sandhive.

The service is `sandhive serve` + `sandhive worker` with auth on and the built-in scripted
model; the MCP server is `sandhive mcp` as a subprocess, over stdio (the client spawns it)
and over streamable HTTP (the client connects with a bearer token that is the Sandhive key).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import BlobResourceContents, CallToolResult, EmbeddedResource, TextContent

from app import __version__
from app.config import Settings
from app.scripted import DEMO_ANSWER
from app.scripted.profile import TOUR_IMAGE
from tests.support.processes import Service, free_port, running_service

ADMIN_KEY = "mcp-admin-key-for-tests"
PROMPT = "Compute the 10th Catalan number and write it to answer.txt"
SCRIPTED = {"prompt": PROMPT, "profile": "scripted", "model": "demo", "wait_s": 240}
UNKNOWN = "tsk_01JZZZZZZZZZZZZZZZZZZZZZZZ"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def service(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    """The API and a worker, keys required, the scripted profile on, no real model."""
    bare = settings.model_copy(
        update={
            "scripted_profile": True,
            "llm_base_url": "",
            "llm_model": "",
            "auth": "keys",
            "admin_api_key": ADMIN_KEY,
        }
    )
    with running_service(bare, tmp_path) as svc:
        yield svc


def _stdio(service: Service, key: str) -> Client:
    params = StdioServerParameters(  # the SDK's default environment plus the key: no settings
        command=sys.executable,
        args=["-m", "app", "mcp", "--server", service.base_url],
        env={"SANDHIVE_API_KEY": key},
        cwd=str(ROOT),
    )
    return Client(params)


def _text(result: CallToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, TextContent), block
    return block.text


def _json(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, _text(result)
    data: dict[str, Any] = json.loads(_text(result))
    return data


async def _check_run_task(client: Client) -> None:
    """run_task's answer, finish reason and artifacts, then the other tools on that task."""
    names = {tool.name for tool in (await client.list_tools()).tools}
    assert names == {
        "run_task",
        "submit_task",
        "get_task",
        "get_trajectory",
        "list_artifacts",
        "read_artifact",
        "cancel_task",
    }
    done = _json(await client.call_tool("run_task", SCRIPTED))
    assert (done["status"], done["finish_reason"], done["answer"]) == (
        "succeeded",
        "submitted",
        DEMO_ANSWER,
    ), done
    paths = [a["path"] for a in done["artifacts"]]
    assert "answer.txt" in paths, done
    task_id = done["id"]
    assert _json(await client.call_tool("get_task", {"task_id": task_id}))["answer"] == DEMO_ANSWER
    read = await client.call_tool("read_artifact", {"task_id": task_id, "path": "answer.txt"})
    assert _text(read).strip() == DEMO_ANSWER
    trajectory = _text(await client.call_tool("get_trajectory", {"task_id": task_id}))
    assert '"submit"' in trajectory, trajectory
    listed = _json(await client.call_tool("list_artifacts", {"task_id": task_id}))
    assert [a["path"] for a in listed["artifacts"]] == paths
    finished = await client.call_tool("cancel_task", {"task_id": task_id})
    assert finished.is_error
    assert "409" in _text(finished), _text(finished)


async def _check_unknown_task(client: Client) -> None:
    """A tool error the model can read, and the server still answers afterwards."""
    missing = await client.call_tool("get_task", {"task_id": UNKNOWN})
    assert missing.is_error
    assert "404 not_found" in _text(missing), _text(missing)
    assert (await client.call_tool("list_artifacts", {"task_id": UNKNOWN})).is_error
    assert {t.name for t in (await client.list_tools()).tools} >= {"get_task"}


async def test_run_task_over_stdio(service: Service) -> None:
    async with _stdio(service, ADMIN_KEY) as client:
        await _check_run_task(client)
        await _check_unknown_task(client)
    async with _stdio(service, "not-a-key") as client:
        refused = await client.call_tool("run_task", SCRIPTED)
        assert refused.is_error
        assert "rejected the API key (401" in _text(refused), _text(refused)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=service.base_url, headers=headers) as api:
        tasks = (await api.get("/v1/tasks")).json()["items"]
    assert len(tasks) == 1, "the refused call stored nothing"


@pytest.fixture
def mcp_http(service: Service, tmp_path: Path) -> Iterator[str]:
    """`sandhive mcp --transport http` in front of the service; its /mcp URL."""
    port = free_port()
    log = tmp_path / "mcp.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHIVE_")}
    env["SANDHIVE_API_KEY"] = ADMIN_KEY  # ignored over HTTP: never lent to a caller
    args = ["mcp", "--transport", "http", "--port", str(port), "--server", service.base_url]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", *args],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@asynccontextmanager
async def _http(url: str, key: str) -> AsyncIterator[Client]:
    """The SDK's client over streamable HTTP, the key as its bearer token (closed after)."""
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx2.AsyncClient(headers=headers, timeout=300) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


async def test_run_task_over_streamable_http(mcp_http: str) -> None:
    async with _http(mcp_http, ADMIN_KEY) as client:
        await _check_run_task(client)
        await _check_unknown_task(client)
    async with _http(mcp_http, "not-a-key") as client:
        refused = await client.call_tool("get_task", {"task_id": UNKNOWN})
        assert refused.is_error
        assert "rejected the API key (401" in _text(refused), _text(refused)
    async with httpx.AsyncClient() as plain:
        anonymous = await plain.post(mcp_http, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith('Bearer realm="sandhive"')
    assert "Authorization: Bearer" in anonymous.json()["error"]["message"]


async def test_read_artifact_gives_a_binary_file_as_an_embedded_resource(mcp_http: str) -> None:
    async with _http(mcp_http, ADMIN_KEY) as client:
        tour = {**SCRIPTED, "model": "tour"}
        done = _json(await client.call_tool("run_task", tour))
        assert done["status"] == "succeeded", done
        image = await client.call_tool("read_artifact", {"task_id": done["id"], "path": TOUR_IMAGE})
    assert not image.is_error
    (block,) = image.content
    assert isinstance(block, EmbeddedResource), block
    resource = block.resource
    assert isinstance(resource, BlobResourceContents), resource
    assert resource.mime_type == "image/png"
    assert resource.uri == f"sandhive://tasks/{done['id']}/artifacts/{TOUR_IMAGE}"
    assert base64.b64decode(resource.blob)[:8] == b"\x89PNG\r\n\x1a\n"


async def test_a_retried_submit_with_the_same_idempotency_key_gives_the_same_task(
    mcp_http: str,
) -> None:
    """A model that retries a submit after a lost answer does not start a second task."""
    once = {"prompt": PROMPT, "profile": "scripted", "model": "demo", "idempotency_key": "k-1"}
    async with _http(mcp_http, ADMIN_KEY) as client:
        first = _json(await client.call_tool("submit_task", once))
        again = _json(await client.call_tool("submit_task", once))
        other = _json(await client.call_tool("submit_task", {**once, "idempotency_key": "k-2"}))
        waited = _json(await client.call_tool("run_task", {**SCRIPTED, "idempotency_key": "k-1"}))
    assert first["id"] == again["id"] == waited["id"], (first, again, waited)
    assert other["id"] != first["id"]
    assert waited["status"] == "succeeded", waited


async def test_a_strict_server_refuses_unknown_arguments_and_says_what_it_is(
    mcp_http: str, service: Service
) -> None:
    """A misspelled argument is a tool error naming it (nothing runs); `serverInfo` has the
    release; `cancel_task` answers the state once the cancel is recorded (`cancelled`)."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with _http(mcp_http, ADMIN_KEY) as client:
        assert client.server_info is not None
        assert (client.server_info.name, client.server_info.version) == ("sandhive", __version__)
        for tool in (await client.list_tools()).tools:
            assert tool.input_schema["additionalProperties"] is False, tool.name
        typo = {"prompt": PROMPT, "profile": "scripted", "model": "demo", "max_stepz": 3}
        refused = await client.call_tool("submit_task", typo)
        assert refused.is_error
        assert "unknown argument max_stepz" in _text(refused), _text(refused)
        assert "submit_task takes" in _text(refused)
        async with httpx.AsyncClient(base_url=service.base_url, headers=headers) as api:
            assert (await api.get("/v1/tasks")).json()["items"] == [], "nothing ran"

        tour = {"prompt": PROMPT, "profile": "scripted", "model": "tour"}
        task = _json(await client.call_tool("submit_task", tour))
        deadline = time.monotonic() + 120
        while True:
            now = _json(await client.call_tool("get_task", {"task_id": task["id"]}))
            if now["status"] == "running":
                break
            assert time.monotonic() < deadline, f"the task never started: {now}"
            await asyncio.sleep(0.2)
        cancelled = _json(await client.call_tool("cancel_task", {"task_id": task["id"]}))
    assert cancelled["status"] == "cancelled", cancelled
    assert "note" not in cancelled


async def test_without_a_token_the_http_server_asks_for_a_key_and_offers_no_oauth(
    mcp_http: str,
) -> None:
    """What the MCP Inspector meets before it has a token: a 401 whose challenge names no
    OAuth metadata, and 404 at the OAuth discovery addresses."""
    root = mcp_http.removesuffix("/mcp")
    async with httpx.AsyncClient() as plain:
        anonymous = await plain.post(mcp_http, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert anonymous.status_code == 401
        challenge = anonymous.headers["www-authenticate"]
        assert challenge.startswith("Bearer ")
        assert "resource_metadata" not in challenge
        for well_known in ("oauth-protected-resource", "oauth-authorization-server"):
            for suffix in ("", "/mcp"):
                found = await plain.get(f"{root}/.well-known/{well_known}{suffix}")
                assert found.status_code == 404, (well_known, suffix)
                assert found.json()["error"]["code"] == "not_found"
