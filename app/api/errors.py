"""Every non-2xx answer in the contract's shape: `{"error": {code, message, details}}`.

`install` registers one handler per kind of failure: our `AppError`s, request
validation, Starlette's HTTP errors (unknown route, wrong method), Postgres or
Redis unreachable (503 + Retry-After, `app.kit.outage`) and anything unexpected
(500, logged, never a stack trace in the body).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from app.config import Settings
from app.errors import AppError
from app.kit import outage

log = logging.getLogger(__name__)

_CODES = {413: "too_large", 422: "invalid_input"}


def error_response(
    status: int,
    code: str,
    message: str,
    details: Any = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"code": code, "message": message, "details": details}}
    return JSONResponse(body, status_code=status, headers=headers)


async def _app_error(_request: Request, exc: AppError) -> JSONResponse:
    return error_response(exc.status, exc.code, exc.message, exc.details, exc.headers() or None)


def _backend_error(retry_after_s: int) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    """503 for a driver error that says Postgres or Redis is unreachable; others stay 500."""

    async def handle(request: Request, exc: Exception) -> JSONResponse:
        down = outage.unavailable(exc, retry_after_s)
        if down is None or request.scope["type"] != "http":
            raise exc  # a bug, not an outage: `_unexpected` answers (and logs) it
        log.warning("%s %s: %s (%r)", request.method, request.url.path, down.code, exc)
        return await _app_error(request, down)

    return handle


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    # Only where and what: echoing `input` could send a huge or secret value back.
    errors = exc.errors()
    details = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in errors]
    message = validation_message(details)
    if details and errors[0]["type"] == "json_invalid":
        message = details[0]["msg"] = _json_problem(exc.body, errors[0])
    elif details[:1] and details[0]["loc"] == ["body"] and not _sent_as_json(request):
        message = (
            "the body must be JSON, sent with Content-Type: application/json; this one came as "
            f"{request.headers.get('content-type') or 'no Content-Type'}"
        )
    return error_response(422, "invalid_input", message, details)


def _json_problem(body: Any, error: Mapping[str, Any]) -> str:
    """`the body is not valid JSON: Expecting value at line 2 column 7` (1-based, as editors)."""
    what = str(error.get("ctx", {}).get("error") or "JSON decode error")
    position = error["loc"][-1] if isinstance(error["loc"][-1], int) else None
    if not isinstance(body, str) or position is None:
        return f"the body is not valid JSON: {what}"
    line = body.count("\n", 0, position) + 1
    column = position - body.rfind("\n", 0, position)
    return f"the body is not valid JSON: {what} at line {line} column {column}"


def _sent_as_json(request: Request) -> bool:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def validation_message(details: list[dict[str, Any]]) -> str:
    """The first problem, located: `limits.max_steps: Input should be ...` (+ how many more)."""
    if not details:
        return "the request is not valid"
    first = details[0]
    loc = [str(part) for part in first["loc"]]
    where = ".".join(loc[1:] if loc[:1] in (["body"], ["query"], ["path"], ["header"]) else loc)
    text = str(first["msg"]).removeprefix("Value error, ")
    more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
    return f"{where}: {text}{more}" if where else f"{text}{more}"


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    phrase = _phrase(exc.status_code)
    code = _CODES.get(exc.status_code, phrase.lower().replace(" ", "_").replace("-", "_"))
    message = exc.detail if isinstance(exc.detail, str) else phrase
    headers = exc.headers
    if exc.status_code == 405:
        given = (headers or {}).get("Allow", "")
        headers = {**(headers or {}), "Allow": allowed_methods(request, given)}
    return error_response(exc.status_code, code, message, headers=headers)


def allowed_methods(request: Request, given: str) -> str:
    """Every method the API documents at this path. Starlette's 405 names only the first
    route's (a path with GET and POST on two routes said `Allow: POST`), while RFC 9110
    asks for all of them; a path the document does not have keeps `given`."""
    matching = [
        (literal, documented)
        for pattern, literal, documented in _documented_paths(request.app)
        if pattern.fullmatch(request.url.path)
    ]
    if any(literal for literal, _ in matching):  # `/v1/tasks/batch`, not `/v1/tasks/{id}`
        matching = [(literal, documented) for literal, documented in matching if literal]
    methods = {method.upper() for _, documented in matching for method in documented}
    return ", ".join(sorted(methods)) if methods else given


def _documented_paths(app: Any) -> list[tuple[re.Pattern[str], bool, list[str]]]:
    """The OpenAPI document's paths as patterns, whether each is literal (no parameter),
    and their methods; built once per app."""
    found: list[tuple[re.Pattern[str], bool, list[str]]] | None = getattr(app.state, "paths", None)
    if found is None:
        found = [
            # `{path}` is the one parameter of ours that spans slashes (`anypath`).
            (compile_path(path.replace("{path}", "{path:path}"))[0], "{" not in path, list(ops))
            for path, ops in app.openapi().get("paths", {}).items()
        ]
        app.state.paths = found
    return found


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "HTTP error"


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal", "internal server error")


def install(app: FastAPI, settings: Settings) -> None:
    app.exception_handler(AppError)(_app_error)
    backend_error = _backend_error(settings.unavailable_retry_after_s)
    for error in outage.LIBRARY_ERRORS:
        app.exception_handler(error)(backend_error)
    app.exception_handler(RequestValidationError)(_validation_error)
    app.exception_handler(StarletteHTTPException)(_http_error)
    app.exception_handler(Exception)(_unexpected)
