"""The rules `app/api/openapi_rules.py` adds to /openapi.json hold both ways: a request the
document admits is not refused for them, and one it rejects the server refuses too.

Each case is checked against the document (jsonschema_rs) and sent to the real server.
tests/security/test_fuzz.py checks the same at scale with schemathesis.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.app import create_app
from app.config import Settings
from tests.api.conftest import assert_error, serve
from tests.api.test_openapi import operations, spec_of, validator

TASK = {"prompt": "What is 6 x 7?"}


async def test_sandbox_options_are_what_this_servers_settings_allow(
    client: httpx.AsyncClient, make_settings: Callable[..., Settings]
) -> None:
    spec = (await client.get("/openapi.json")).json()
    check = validator(spec, "TaskCreate")
    refused_here = [
        {"network": "egress"},  # egress is off on this server
        {"read_only_rootfs": False},  # so is a writable root filesystem
        {"allow_domains": ["pypi.org"]},  # and filtering by name
    ]
    for sandbox in refused_here:
        body = {**TASK, "sandbox": sandbox}
        assert not check.is_valid(body), sandbox
        assert_error(await client.post("/v1/tasks", json=body), 422, "invalid_input")
    plain = {**TASK, "sandbox": {"network": "none", "read_only_rootfs": True}}
    assert check.is_valid(plain)
    assert (await client.post("/v1/tasks", json=plain)).status_code == 202

    proxied = spec_of(
        make_settings(
            sandbox_egress_enabled=True,
            sandbox_egress_proxy=True,
            sandbox_egress_domains=["pypi.org"],
            sandbox_allow_writable_rootfs=True,
        )
    )
    props = proxied["components"]["schemas"]["SandboxRequest"]["properties"]
    assert props["network"]["enum"] == ["none", "egress"]
    assert "enum" not in props["read_only_rootfs"]
    check = validator(proxied, "TaskCreate")
    assert check.is_valid({**TASK, "sandbox": {"network": "egress", "allow_domains": ["pypi.org"]}})
    assert not check.is_valid({**TASK, "sandbox": {"allow_domains": ["pypi.org"]}})
    assert check.is_valid({**TASK, "sandbox": {"allow_domains": None}})


async def test_a_command_is_exactly_one_of_argv_and_command(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    check = validator(spec, "ExecRequest")
    for body in ({"argv": ["ls"], "command": "ls"}, {}, {"stdin": "x"}):
        assert not check.is_valid(body), body
        refused = await client.post("/v1/sandboxes/sbx_unknown/exec", json=body)
        assert_error(refused, 422, "invalid_input")
    for body in ({"argv": ["ls"]}, {"command": "ls"}, {"argv": ["ls"], "command": None}):
        assert check.is_valid(body), body
        # Valid: it gets as far as looking the sandbox up.
        unknown = await client.post("/v1/sandboxes/sbx_unknown/exec", json=body)
        assert_error(unknown, 404, "not_found")


async def test_a_whole_number_written_with_a_point_is_a_whole_number(
    client: httpx.AsyncClient,
) -> None:
    """JSON Schema's `integer` admits 60.0, so the server takes it; 60.5, "60", true not."""
    spec = (await client.get("/openapi.json")).json()
    check = validator(spec, "TtlRequest")
    assert check.is_valid({"ttl_s": 60.0})
    unknown = await client.post("/v1/sandboxes/sbx_unknown/ttl", json={"ttl_s": 60.0})
    assert_error(unknown, 404, "not_found")
    for value in (60.5, "60", True):
        assert not check.is_valid({"ttl_s": value}), value
        refused = await client.post("/v1/sandboxes/sbx_unknown/ttl", json={"ttl_s": value})
        assert_error(refused, 422, "invalid_input")
    task = {**TASK, "limits": {"max_steps": 3.0}}
    accepted = await client.post("/v1/tasks", json=task)
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["limits"]["max_steps"] == 3


async def test_string_query_parameters_refuse_nul_in_the_document_too(
    client: httpx.AsyncClient,
) -> None:
    spec = (await client.get("/openapi.json")).json()
    strings = [
        (method, path, parameter["name"], parameter["schema"])
        for method, path, operation in operations(spec)
        for parameter in operation.get("parameters", [])
        if parameter["in"] == "query" and parameter["schema"].get("type") == "string"
    ]
    assert len(strings) > 10
    for method, path, name, schema in strings:
        if "enum" in schema:
            continue
        assert re.search(schema["pattern"], "a\x00b") is None, (method, path, name)
    refused = await client.get("/v1/tasks", params={"cursor": "a\x00b"})
    assert_error(refused, 422, "invalid_input")


@pytest.mark.parametrize(
    ("url", "valid"),
    [
        ("https://hooks.example.com/sandhive?x=1", True),
        ("HTTP://hooks.example.com:8080", True),
        ("", False),
        ("ftp://hooks.example.com/", False),
        ("https://user:pw@hooks.example.com/", False),
        ("https:///path", False),
        ("https://hooks.example.com/a b", False),
    ],
)
async def test_a_webhook_url_is_http_with_a_host_in_the_document_too(
    make_settings: Callable[..., Settings], url: str, valid: bool
) -> None:
    settings = make_settings()
    check = validator(spec_of(settings), "WebhookCreate")
    body = {"url": url, "events": ["task.finished"]}
    assert check.is_valid(body) is valid
    async with serve(create_app(settings)) as client:
        answer = await client.post("/v1/webhooks", json=body)
    if valid:
        assert answer.status_code == 201, answer.text
    else:
        assert_error(answer, 422, "invalid_input")


async def test_the_reference_tools_profile_runs_a_fresh_shell_in_the_document_too(
    client: httpx.AsyncClient,
) -> None:
    spec = (await client.get("/openapi.json")).json()
    check = validator(spec, "TaskCreate")
    wrong: dict[str, Any] = {**TASK, "tools": {"profile": "reference", "shell": "persistent"}}
    assert not check.is_valid(wrong)
    assert_error(await client.post("/v1/tasks", json=wrong), 422, "invalid_input")
    for tools in ({"profile": "reference"}, {"shell": "persistent"}):
        assert check.is_valid({**TASK, "tools": tools}), tools
        assert (await client.post("/v1/tasks", json={**TASK, "tools": tools})).status_code == 202


async def test_profiles_without_a_default_model_or_a_default_profile_are_said_too(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """Only profile `p` (models a and b, no default model): a task names `p` and a model."""
    toml = tmp_path / "profiles.toml"
    toml.write_text('[profiles.p]\nbase_url = "http://127.0.0.1:9/v1"\nmodels = ["a", "b"]\n')
    settings = make_settings(llm_base_url="", llm_profiles_file=toml, scripted_profile=False)
    check = validator(spec_of(settings), "TaskCreate")
    refused = [
        TASK,
        {**TASK, "llm": {"profile": "p"}},
        {**TASK, "llm": {"profile": "p", "model": "c"}},
    ]
    accepted = {**TASK, "llm": {"profile": "p", "model": "a"}}
    assert check.is_valid(accepted)
    async with serve(create_app(settings)) as client:
        for body in refused:
            assert not check.is_valid(body), body
            assert_error(await client.post("/v1/tasks", json=body), 422, "invalid_input")
        assert (await client.post("/v1/tasks", json=accepted)).status_code == 202
    arm = validator(spec_of(settings), "ArmCreate")
    assert not arm.is_valid({"name": "a"})
    assert arm.is_valid({"name": "a", "task": {"llm": {"profile": "p", "model": "b"}}})


def test_a_broken_image_catalogue_does_not_break_the_document(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    broken = tmp_path / "images.toml"
    broken.write_text("not [ toml")
    spec = spec_of(make_settings(sandbox_images_file=broken))
    image = spec["components"]["schemas"]["SandboxRequest"]["properties"]["image"]
    assert image["anyOf"][0] == {"enum": ["default"]}
