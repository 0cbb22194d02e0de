"""The OpenAPI document as this server really answers: its key scheme, its limits, its errors.

FastAPI builds `/openapi.json` from the routes and the wire models (their attribute
docstrings are the field descriptions). What it cannot know is added here, once:

- the bearer scheme, required by exactly the operations whose route depends on
  `current_tenant` (derived from the routes, so a new route cannot be documented wrong);
  none is required when `SANDHIVE_AUTH=disabled`;
- the limits of the Settings this app was built with: the models carry only hard parsing
  ceilings (a prompt of 10,000,000 characters), while the server refuses past
  `SANDHIVE_MAX_PROMPT_CHARS`; a client that trusts the schema should not get a 422;
- 422 in the contract's error shape (FastAPI documents its own `HTTPValidationError`,
  which this API never sends);
- the request examples of the models, as named examples of their request bodies;
- optional query and header parameters as what they are when given, without FastAPI's
  `null` alternative (a parameter is left out, never sent as null);
- the rules the server enforces across fields or by its settings (`openapi_rules`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute

from app.api import openapi_rules
from app.api.deps import current_tenant
from app.config import Settings
from app.domain.image_catalogue import catalogue_or_default
from app.domain.prompt_configs import known_names
from app.schemas.experiments import EXPERIMENT_EXAMPLES
from app.schemas.tasks import TASK_EXAMPLES

BEARER = "bearer"
REQUEST_EXAMPLES: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    ("/v1/tasks", "post"): TASK_EXAMPLES,
    ("/v1/experiments", "post"): EXPERIMENT_EXAMPLES,
}
_FASTAPI_422 = ("HTTPValidationError", "ValidationError")
_INVALID = (
    "The request is not valid: `error.message` names the first problem, "
    "`error.details` lists every one (`loc`, `msg`, `type`)"
)


@dataclass(frozen=True)
class Limit:
    """A schema keyword whose real value is a setting (the smaller of the two applies)."""

    schema: str
    field: str
    keyword: str
    setting: str
    unit: str = ""


LIMITS = (
    Limit("TaskCreate", "prompt", "maxLength", "max_prompt_chars", " characters"),
    Limit("TaskCreate", "input_files", "maxItems", "max_input_files", " files"),
    Limit("LLMOptions", "max_tokens_per_call", "maximum", "max_max_tokens_per_call"),
    Limit("Limits", "max_steps", "maximum", "max_max_steps"),
    Limit("Limits", "timeout_s", "maximum", "max_timeout_s"),
    Limit("Limits", "command_timeout_s", "maximum", "max_command_timeout_s"),
    Limit("Limits", "max_context_tokens", "maximum", "max_max_context_tokens"),
    Limit("SandboxRequest", "cpus", "maximum", "max_cpus"),
    Limit("SandboxRequest", "memory_mb", "maximum", "max_memory_mb"),
    Limit("SandboxRequest", "disk_mb", "maximum", "max_disk_mb"),
    Limit("DatasetIn", "rows", "maxItems", "experiment_max_rows", " rows"),
    Limit("ExperimentCreate", "arms", "maxItems", "experiment_max_arms", " arms"),
    Limit("ExperimentCreate", "attempts", "maximum", "experiment_max_attempts"),
    Limit("ExperimentCreate", "concurrency", "maximum", "experiment_max_concurrency"),
    Limit("TaskBatchCreate", "tasks", "maxItems", "max_batch_tasks", " tasks"),
    Limit("Verifier", "timeout_s", "maximum", "verifier_max_timeout_s"),
)
SIZE_NOTES = (
    ("TaskCreate", "metadata", "max_metadata_bytes", "bytes as compact JSON"),
    ("ExperimentCreate", "metadata", "max_metadata_bytes", "bytes as compact JSON"),
    ("InputFile", "content_base64", "max_input_file_bytes", "bytes once decoded"),
    ("TaskCreate", "input_files", "max_input_total_bytes", "bytes in all, once decoded"),
    ("PromptPair", "system", "max_prompt_chars", "characters with `instance`"),
)
"""Limits no JSON Schema keyword can state: said in the field's description."""
_TYPES = {"maxLength": ("string",), "maxItems": ("array",), "maximum": ("integer", "number")}


def install(app: FastAPI, settings: Settings, routers: Sequence[APIRouter]) -> None:
    """Make `app.openapi()` (so `/openapi.json` and `/docs`) describe this server.

    `routers` are the app's (their routes say which need a key).
    """
    build = app.openapi
    built_for: list[object] = [None]

    def openapi() -> dict[str, Any]:
        # Built again when what it lists changes (the profiles, images and prompt configs
        # files are re-read when they change).
        key = _server_key(settings)
        if app.openapi_schema is None or built_for[0] != key:
            app.openapi_schema = None
            schema = build()
            describe(schema, routers, settings)
            app.openapi_schema, built_for[0] = schema, key
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _server_key(settings: Settings) -> object:
    """What the document lists that the operator may change while the server runs (files
    re-read when they change): LLM profiles, catalogue images, prompt configs."""
    found = settings.llm_profiles().items()
    return (
        sorted((name, p.model, tuple(p.models)) for name, p in found),
        sorted(catalogue_or_default(settings)),
        known_names(settings.prompt_configs_dir),
    )


def describe(schema: dict[str, Any], routers: Sequence[APIRouter], settings: Settings) -> None:
    """Add what the models and routes cannot say to FastAPI's document, in place."""
    _declare_auth(schema, routers, settings)
    _apply_limits(schema["components"]["schemas"], settings)
    _contract_422(schema)
    _request_examples(schema)
    _omit_not_null(schema)
    openapi_rules.apply(schema, settings)


def _declare_auth(schema: dict[str, Any], routers: Sequence[APIRouter], settings: Settings) -> None:
    required = settings.auth != "disabled"
    how = (
        "An API key (`sandhive keys create --tenant NAME` prints one) as "
        "`Authorization: Bearer <key>`; a WebSocket may pass it as `?token=` instead."
    )
    if not required:
        how += " This server runs with SANDHIVE_AUTH=disabled: no key is needed."
    schemes = schema["components"].setdefault("securitySchemes", {})
    schemes[BEARER] = {"type": "http", "scheme": "bearer", "description": how}
    for route, operation in _operations(routers, schema):
        if required and _needs_tenant(route.dependant):
            operation["security"] = [{BEARER: []}]


def _operations(
    routers: Sequence[APIRouter], schema: dict[str, Any]
) -> Iterator[tuple[APIRoute, Any]]:
    for route in (route for router in routers for route in router.routes):
        if not (isinstance(route, APIRoute) and route.include_in_schema):
            continue
        item = schema["paths"].get(route.path_format, {})
        for method in sorted(route.methods or ()):
            if method.lower() in item:
                yield route, item[method.lower()]


def _needs_tenant(dependant: Any) -> bool:
    """Whether `current_tenant` is among a route's dependencies, however deep."""
    return any(dep.call is current_tenant or _needs_tenant(dep) for dep in dependant.dependencies)


def _apply_limits(components: dict[str, Any], settings: Settings) -> None:
    for limit in LIMITS:
        value = getattr(settings, limit.setting)
        prop = components[limit.schema]["properties"][limit.field]
        real = _constrain(prop, limit.keyword, value)
        env = f"SANDHIVE_{limit.setting.upper()}"
        _note(prop, f"At most {_number(real)}{limit.unit} on this server ({env}).")
    for schema, field, setting, unit in SIZE_NOTES:
        value = getattr(settings, setting)
        env = f"SANDHIVE_{setting.upper()}"
        _note(
            components[schema]["properties"][field],
            f"At most {value} {unit} on this server ({env}).",
        )


def _constrain(prop: dict[str, Any], keyword: str, value: float) -> float:
    """Set `keyword` to `value` where the property has it (or its type takes it); the least."""
    targets = [branch for branch in _branches(prop) if _takes(branch, keyword)]
    if not targets:
        raise LookupError(f"no {keyword} to set in {prop}")
    least: float = min([value, *(branch[keyword] for branch in targets if keyword in branch)])
    for branch in targets:
        branch[keyword] = least
    return least


def _branches(prop: dict[str, Any]) -> list[dict[str, Any]]:
    return [prop, *prop.get("anyOf", [])]


def _takes(branch: dict[str, Any], keyword: str) -> bool:
    return keyword in branch or branch.get("type") in _TYPES[keyword]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _note(prop: dict[str, Any], sentence: str) -> None:
    prop["description"] = f"{prop.get('description', '').rstrip()} {sentence}".strip()


def _contract_422(schema: dict[str, Any]) -> None:
    """Point every 422 at `ErrorOut`, then drop FastAPI's unused validation schemas."""
    ref = {"$ref": "#/components/schemas/ErrorOut"}
    for operation in _all_operations(schema):
        response = operation.get("responses", {}).get("422")
        if response is not None:
            response["content"] = {"application/json": {"schema": ref}}
            response["description"] = _INVALID
    components = schema["components"]["schemas"]
    for name in _FASTAPI_422:
        components.pop(name, None)


def _all_operations(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for item in schema["paths"].values():
        yield from (op for method, op in item.items() if method != "parameters")


def _omit_not_null(schema: dict[str, Any]) -> None:
    """An optional query or header parameter is left out, never sent as null: the text
    `null` in `Last-Event-ID: null` or `?cursor=null` is not a null, so FastAPI's
    `anyOf: [X, {type: null}]` for `X | None = None` is documented as plain `X`."""
    for operation in _all_operations(schema):
        for parameter in operation.get("parameters", []):
            found = parameter.get("schema", {})
            branches = found.get("anyOf")
            if parameter.get("required") or not branches:
                continue
            kept = [b for b in branches if b.get("type") != "null"]
            if len(kept) == 1 and len(kept) < len(branches):
                rest = {k: v for k, v in found.items() if k != "anyOf" and v is not None}
                parameter["schema"] = {**kept[0], **rest}


def _request_examples(schema: dict[str, Any]) -> None:
    for (path, method), examples in REQUEST_EXAMPLES.items():
        body = schema["paths"][path][method]["requestBody"]["content"]["application/json"]
        body["examples"] = examples
