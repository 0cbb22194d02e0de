"""`/openapi.json` describes the server as it really answers, and `/docs` shows it offline.

Every field of every public model has a description; the main requests carry examples
that the schema accepts and the server accepts (202); the bearer scheme is declared and
required by exactly the /v1 operations; limits are the server's settings, not the models'
parsing ceilings; `/docs` asks no other host for anything (app/api/docs.py).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pytest

from app.api import docs
from app.api.app import create_app
from app.config import Settings
from app.schemas.tasks import MAX_TEXT_CHARS
from tests.api.conftest import assert_error, serve

MAIN_REQUESTS = {"/v1/tasks": "TaskCreate", "/v1/experiments": "ExperimentCreate"}
UNDESCRIBED: dict[str, str] = {}
"""`Schema.field` -> why it has no description. Empty: every field has one."""
PUBLIC = {"/healthz", "/readyz", "/metrics"}
ROOT = Path(__file__).resolve().parents[2]


def spec_of(settings: Settings) -> dict[str, Any]:
    schema: dict[str, Any] = create_app(settings).openapi()
    return schema


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, item in spec["paths"].items()
        for method, operation in item.items()
        if method in ("get", "post", "put", "patch", "delete")
    ]


def validator(spec: dict[str, Any], component: str) -> Any:
    """A JSON Schema validator for one component, its `$ref`s resolved in the document."""
    root = {"$ref": f"#/components/schemas/{component}", "components": spec["components"]}
    return jsonschema_rs.validator_for(root)


async def test_every_field_of_every_public_model_is_described(client: httpx.AsyncClient) -> None:
    response = await client.get("/openapi.json")
    assert response.status_code == 200, response.text
    components = response.json()["components"]["schemas"]
    assert {"TaskCreate", "TaskOut", "StepOut", "ExperimentCreate", "ResultsOut"} <= set(components)
    checked, missing = 0, []
    for name, schema in sorted(components.items()):
        for field, prop in schema.get("properties", {}).items():
            checked += 1
            if not str(prop.get("description", "")).strip():
                missing.append(f"{name}.{field}")
    assert sorted(set(missing) - set(UNDESCRIBED)) == [], (
        "fields without a description: write a docstring under each field "
        "(the models use ConfigDict(use_attribute_docstrings=True))"
    )
    assert checked > 200, "the public models are all in the document"


async def test_fastapis_own_validation_shape_is_not_documented(client: httpx.AsyncClient) -> None:
    """The server answers 422 in the contract's shape, and the document says so."""
    spec = (await client.get("/openapi.json")).json()
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    assert "ValidationError" not in spec["components"]["schemas"]
    for method, path, operation in operations(spec):
        invalid = operation["responses"].get("422")
        if invalid is not None:
            ref = invalid["content"]["application/json"]["schema"]["$ref"]
            assert ref == "#/components/schemas/ErrorOut", (method, path)
    refused = await client.post("/v1/tasks", json={"prompt": ""})
    assert_error(refused, 422, "invalid_input")
    assert validator(spec, "ErrorOut").is_valid(refused.json())


@pytest.mark.parametrize(("path", "component"), sorted(MAIN_REQUESTS.items()))
def test_main_requests_have_examples_their_schema_accepts(
    make_settings: Callable[..., Settings], path: str, component: str
) -> None:
    spec = spec_of(make_settings(scripted_profile=True))  # the examples name it (`make run`)
    body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    examples = body["examples"]
    assert examples, f"POST {path} has no example"
    check = validator(spec, component)
    for name, example in examples.items():
        assert example["summary"], name
        errors = [error.message for error in check.iter_errors(example["value"])]
        assert errors == [], (name, errors)
    values = [example["value"] for example in examples.values()]
    assert spec["components"]["schemas"][component]["examples"] == values
    broken = {key: value for key, value in values[0].items() if key not in ("prompt", "name")}
    assert not check.is_valid(broken), "the validator really checks (a required field is gone)"


async def test_the_examples_are_accepted_by_the_server(
    make_settings: Callable[..., Settings],
) -> None:
    """As documented: the scripted profile on (`make run`), and a `default` one configured."""
    settings = make_settings(scripted_profile=True)
    spec = spec_of(settings)
    async with serve(create_app(settings)) as client:
        for path in MAIN_REQUESTS:
            body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
            for name, example in body["examples"].items():
                response = await client.post(path, json=example["value"])
                assert response.status_code == 202, (path, name, response.text)


async def test_bearer_scheme_is_required_by_every_v1_operation_and_no_public_one(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(auth="keys")
    spec = spec_of(settings)
    scheme = spec["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert "sandhive keys create" in scheme["description"]
    ops = operations(spec)
    assert {path for _, path, _ in ops if not path.startswith("/v1/")} == PUBLIC
    for method, path, operation in ops:
        expected = [{"bearer": []}] if path.startswith("/v1/") else None
        assert operation.get("security") == expected, (method, path)
    assert "security" not in spec, "no document-wide requirement: the probes are public"
    async with serve(create_app(settings)) as client:
        refused = await client.get("/v1/tasks")
        health = await client.get("/healthz")
    assert_error(refused, 401, "unauthorized")
    assert health.status_code == 200


def test_no_operation_requires_a_key_when_auth_is_disabled(
    make_settings: Callable[..., Settings],
) -> None:
    spec = spec_of(make_settings(auth="disabled"))
    assert (
        "SANDHIVE_AUTH=disabled" in spec["components"]["securitySchemes"]["bearer"]["description"]
    )
    assert [path for _, path, op in operations(spec) if "security" in op] == []


@pytest.mark.parametrize("max_prompt_chars", [20_000, 200_000])
async def test_prompt_limit_in_the_schema_is_the_servers(
    make_settings: Callable[..., Settings], max_prompt_chars: int
) -> None:
    settings = make_settings(max_prompt_chars=max_prompt_chars)
    async with serve(create_app(settings)) as client:
        spec = (await client.get("/openapi.json")).json()
        prompt = spec["components"]["schemas"]["TaskCreate"]["properties"]["prompt"]
        assert prompt["maxLength"] == max_prompt_chars
        assert f"At most {max_prompt_chars} characters" in prompt["description"]
        assert "SANDHIVE_MAX_PROMPT_CHARS" in prompt["description"]
        at_limit = await client.post("/v1/tasks", json={"prompt": "x" * max_prompt_chars})
        over = await client.post("/v1/tasks", json={"prompt": "x" * (max_prompt_chars + 1)})
    assert at_limit.status_code == 202, at_limit.text
    assert "prompt" in assert_error(over, 422, "invalid_input")["message"]


def test_a_setting_above_the_parsing_ceiling_documents_the_ceiling(
    make_settings: Callable[..., Settings],
) -> None:
    spec = spec_of(make_settings(max_prompt_chars=MAX_TEXT_CHARS * 2))
    prompt = spec["components"]["schemas"]["TaskCreate"]["properties"]["prompt"]
    assert prompt["maxLength"] == MAX_TEXT_CHARS


def limit_of(prop: dict[str, Any], keyword: str) -> Any:
    found = [branch[keyword] for branch in [prop, *prop.get("anyOf", [])] if keyword in branch]
    assert len(found) == 1, prop
    return found[0]


@pytest.mark.parametrize("scale", [1, 2])
async def test_every_settings_limit_is_in_the_schema_and_enforced_there(
    make_settings: Callable[..., Settings], scale: int
) -> None:
    """Each documented maximum is accepted and one past it refused, under two settings."""
    settings = make_settings(
        max_max_steps=50 * scale,
        max_timeout_s=600 * scale,
        max_memory_mb=2048 * scale,
        max_max_tokens_per_call=4096 * scale,
        experiment_max_arms=2 * scale,
        experiment_max_attempts=3 * scale,
    )
    spec = spec_of(settings)
    schemas = spec["components"]["schemas"]
    cases = [
        (("Limits", "max_steps"), ("limits", "max_steps"), 50 * scale),
        (("Limits", "timeout_s"), ("limits", "timeout_s"), 600 * scale),
        (("SandboxRequest", "memory_mb"), ("sandbox", "memory_mb"), 2048 * scale),
        (("LLMOptions", "max_tokens_per_call"), ("llm", "max_tokens_per_call"), 4096 * scale),
    ]
    async with serve(create_app(settings)) as client:
        for (schema, field), (group, key), expected in cases:
            prop = schemas[schema]["properties"][field]
            assert limit_of(prop, "maximum") == expected, (schema, field)
            assert f"At most {expected} on this server" in prop["description"]
            ok = await client.post("/v1/tasks", json={"prompt": "p", group: {key: expected}})
            assert ok.status_code == 202, ok.text
            over = {"prompt": "p", group: {key: expected + 1}}
            refused = await client.post("/v1/tasks", json=over)
            assert f"{group}.{key}" in assert_error(refused, 422, "invalid_input")["message"]
        experiment = schemas["ExperimentCreate"]["properties"]
        assert limit_of(experiment["arms"], "maxItems") == 2 * scale
        assert limit_of(experiment["attempts"], "maximum") == 3 * scale
        body = {
            "name": "limits",
            "dataset": {"rows": [{"id": "r", "problem_statement": "p", "ground_truth": "1"}]},
            "arms": [{"name": f"a{i}"} for i in range(2 * scale + 1)],
            "scorer": {"kind": "exact"},
        }
        refused = await client.post("/v1/experiments", json=body)
        assert_error(refused, 422, "invalid_input")
        body["arms"] = body["arms"][: 2 * scale]
        accepted = await client.post("/v1/experiments", json=body)
        assert accepted.status_code == 202, accepted.text


ASSET_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


async def test_docs_page_loads_only_local_assets_and_they_are_served(
    client: httpx.AsyncClient,
) -> None:
    page = await client.get("/docs")
    assert page.status_code == 200, page.text
    assert page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    script_src = re.search(r"script-src ([^;]*)", csp)
    assert script_src is not None
    assert script_src.group(1).split() == ["'self'"], "no inline or remote script"
    assert re.search(r"https?://", page.text) is None, "no URL of another host"
    assert "<script>" not in page.text, "no inline script (the CSP would block it)"
    urls = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert len(urls) == 4, urls
    for url in urls:
        assert url.startswith("/docs/assets/"), url
        asset = await client.get(url)
        assert asset.status_code == 200, url
        suffix = url[url.rindex(".") :]
        assert asset.headers["content-type"].startswith(ASSET_TYPES[suffix]), url
        assert asset.content, url
    bundle = await client.get("/docs/assets/swagger-ui-bundle.js")
    assert "SwaggerUIBundle" in bundle.text
    openapi_url = re.search(r'data-openapi-url="([^"]+)"', page.text)
    assert openapi_url is not None
    assert (await client.get(openapi_url.group(1))).status_code == 200
    assert_error(await client.get("/docs/assets/README.md"), 404, "not_found")
    assert (await client.get("/redoc")).status_code == 404, "ReDoc would need a CDN"


def test_every_docs_asset_ships_in_the_package() -> None:
    """pyproject's package-data globs (one directory level each) cover what /docs serves."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["app"]
    for path, _media_type in docs.ASSETS.values():
        parts = f"web/{path}".split("/")
        shipped = any(
            len(glob.split("/")) == len(parts)
            and all(fnmatch(part, g) for part, g in zip(parts, glob.split("/"), strict=True))
            for glob in patterns
        )
        assert shipped, f"app/web/{path} is not in [tool.setuptools.package-data]"
        assert (docs.WEB_DIR / path).is_file(), path
