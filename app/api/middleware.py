"""The API's edge as pure ASGI middleware: body limits, browser origins, hostile URLs, redaction.

- `BodyLimit` counts request bytes as they arrive (chunked bodies included) and
  answers 413 as soon as the cap is crossed, never after reading it all; the
  whole body must arrive within `request_body_timeout_s` (else 408).
- `OriginGuard` refuses browser requests and WebSocket handshakes whose
  `Origin` is neither the API's own nor allow-listed; CORS answers for the
  allow-listed ones.
- `UrlGuard` answers URLs that carry NUL (which Postgres cannot even compare).
- `install_log_redaction` keeps `?token=` out of uvicorn's access and
  WebSocket logs.

Every refusal uses the contract's error shape. `install(app, settings)` is
called once by `app.api.app.create_app`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.config import Settings

CLOSE_FORBIDDEN = 4403
CLOSE = {"Connection": "close"}
"""On a refused body: the rest of it is never read, so the connection cannot be reused."""
REDACTED = "[redacted]"
_SECRET_PARAMS = re.compile(r"(?i)([?&](?:token|access_token|api_key|key)=)[^&\s\"']*")
CORS_HEADERS = ["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID"]


def install(app: FastAPI, settings: Settings) -> None:
    """Register the edge middleware (outermost first: URL, origin, CORS, body) and redaction."""
    app.add_middleware(
        BodyLimit,
        json_max=settings.max_json_body_bytes,
        multipart_max=settings.max_multipart_body_bytes,
        timeout_s=settings.request_body_timeout_s,
        files_max=settings.task_files_max_write_bytes,
        sandbox_files_max=settings.sandbox_files_max_bytes,
        # stdin travels base64 in the JSON of a command
        sandbox_exec_max=settings.sandbox_exec_max_stdin_bytes * 4 // 3
        + settings.max_json_body_bytes,
        image_build_max=settings.image_build_max_bytes,
    )
    if settings.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.allowed_origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=CORS_HEADERS,
            expose_headers=["Location", "Retry-After"],
            max_age=600,
        )
    app.add_middleware(OriginGuard, allowed=tuple(settings.allowed_origins))
    app.add_middleware(UrlGuard)
    install_log_redaction()
    document_edge_errors(app)


EDGE_ERRORS = {
    "400": "The body could not be parsed (JSON or multipart)",
    "403": "A browser origin that is not allowed",
    "408": "The request body did not arrive in time",
    "413": "The request body, or a part of it, is too large",
}
KEYED_ERRORS = {
    "401": "No API key, or an unknown or revoked one",
    "429": "Over the tenant's request rate or a queue limit; see Retry-After",
    "503": "Postgres or Redis unreachable (database_unavailable, redis_unavailable);"
    " nothing was done; see Retry-After",
}


def document_edge_errors(app: FastAPI) -> None:
    """Declare in OpenAPI the errors this edge (and the key check) can answer on any route."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for path, item in schema.get("paths", {}).items():
                extra = {**EDGE_ERRORS, **(KEYED_ERRORS if path.startswith("/v1/") else {})}
                for operation in item.values():
                    responses = operation.setdefault("responses", {})
                    for status, description in extra.items():
                        responses.setdefault(status, _error_response(description))
        return app.openapi_schema or build()

    app.openapi = openapi  # type: ignore[method-assign]


def _error_response(description: str) -> dict[str, Any]:
    ref = {"$ref": "#/components/schemas/ErrorOut"}
    return {"description": description, "content": {"application/json": {"schema": ref}}}


async def send_error(
    send: Send,
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    details: object = None,
) -> None:
    """A complete error response in the contract's shape, straight over ASGI."""
    error = {"code": code, "message": message, "details": details}
    body = json.dumps({"error": error}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def refuse_websocket(receive: Receive, send: Send) -> None:
    """Refuse a handshake: the server answers it with HTTP 403."""
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": CLOSE_FORBIDDEN})


# Request bodies


class BodyTooLarge(HTTPException):
    """Raised from `receive` so FastAPI's body parsing passes it on untouched (HTTPException)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes", headers=CLOSE)


class BodyTimeout(HTTPException):
    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            408,
            f"request body not received within {timeout_s:g} s",
            headers={"Connection": "close"},
        )


class BodyLimit:
    """Caps each HTTP request body (multipart has its own cap) in size and in time."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        json_max: int,
        multipart_max: int,
        timeout_s: float,
        files_max: int | None = None,
        sandbox_files_max: int | None = None,
        sandbox_exec_max: int | None = None,
        image_build_max: int | None = None,
    ) -> None:
        self.app = app
        self.json_max = json_max
        self.multipart_max = multipart_max
        self.timeout_s = timeout_s
        self.files_max = files_max
        """Cap of a `PUT /v1/tasks/{id}/files/{path}` body (a file for a running sandbox)."""
        self.sandbox_files_max = sandbox_files_max
        """Cap of a sandbox's file write (`PUT /v1/sandboxes/{id}/files`)."""
        self.sandbox_exec_max = sandbox_exec_max
        """Cap of a sandbox's command (`POST /v1/sandboxes/{id}/exec`): its stdin, base64."""
        self.image_build_max = image_build_max
        """Cap of a tenant's image build (`POST /v1/images/builds`): its context, base64."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        multipart = headers.get("content-type", "").lower().startswith("multipart/")
        limit = self.multipart_max if multipart else self.json_max
        if self.files_max is not None and _is_file_write(scope):
            limit = self.files_max
        upload = _upload_kind(scope)
        if upload == "files" and self.sandbox_files_max is not None:
            limit = self.sandbox_files_max
        elif upload == "exec" and self.sandbox_exec_max is not None:
            limit = self.sandbox_exec_max
        elif upload == "build" and self.image_build_max is not None:
            limit = self.image_build_max
        declared = _content_length(headers)
        # A sandbox file's refusal names it, as the route's own would (`details.reason`).
        details = _file_details(scope) if upload == "files" else None
        if declared is not None and declared > limit:  # refuse before reading a byte
            exc: HTTPException = BodyTooLarge(limit)
            await send_error(send, exc.status_code, "too_large", exc.detail, exc.headers, details)
            return
        reader = _BodyReader(receive, limit, self.timeout_s)
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, reader.receive, tracked)
        except (BodyTooLarge, BodyTimeout) as exc:  # only if no handler answered already
            if started:
                raise
            code = "too_large" if exc.status_code == 413 else "request_timeout"
            more = details if exc.status_code == 413 else None
            await send_error(send, exc.status_code, code, exc.detail, exc.headers, more)


_FILE_WRITE = re.compile(r"/v1/tasks/[^/]+/files/")


def _is_file_write(scope: Scope) -> bool:
    return scope.get("method") == "PUT" and _FILE_WRITE.match(scope.get("path", "")) is not None


_SANDBOX_UPLOAD = re.compile(r"/v1/sandboxes/[^/]+/(exec|exec/stream|files)$")


def _upload_kind(scope: Scope) -> str | None:
    """The body cap a request has apart from JSON's: `files` for a sandbox's file write,
    `exec` for its command, `build` for an image build; None otherwise."""
    method, path = scope.get("method"), scope.get("path", "")
    if method == "POST" and path == "/v1/images/builds":
        return "build"
    found = _SANDBOX_UPLOAD.match(path) if method in ("POST", "PUT") else None
    if found is None:
        return None
    return "files" if found.group(1) == "files" else "exec"


def _file_details(scope: Scope) -> dict[str, object]:
    path = parse_qs(scope.get("query_string", b"").decode(errors="replace")).get("path", [""])
    return {"reason": "too_large", "path": path[0]}


def _content_length(headers: Headers) -> int | None:
    try:
        value = int(headers.get("content-length", ""))
    except ValueError:
        return None
    return value if value >= 0 else None


class _BodyReader:
    """`receive` that counts body bytes and enforces the deadline until the body is complete."""

    def __init__(self, receive: Receive, limit: int, timeout_s: float) -> None:
        self._receive = receive
        self._limit = limit
        self._timeout_s = timeout_s
        self._deadline = asyncio.get_running_loop().time() + timeout_s
        self._count = 0
        self._done = False

    async def receive(self) -> Message:
        if self._done:  # afterwards only http.disconnect can come, whenever it comes
            return await self._receive()
        left = self._deadline - asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(max(left, 0.0)):
                message = await self._receive()
        except TimeoutError:
            raise BodyTimeout(self._timeout_s) from None
        if message["type"] == "http.request":
            self._count += len(message.get("body", b""))
            if self._count > self._limit:
                raise BodyTooLarge(self._limit)
            self._done = not message.get("more_body", False)
        else:
            self._done = True
        return message


# Browser origins


class OriginGuard:
    """Requests carrying an `Origin` must come from the API's own origin or the allow-list."""

    def __init__(self, app: ASGIApp, *, allowed: tuple[str, ...]) -> None:
        self.app = app
        self.allowed = frozenset(origin.rstrip("/").lower() for origin in allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None or self.permits(origin, headers.get("host", "")):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await refuse_websocket(receive, send)
        else:
            await send_error(send, 403, "forbidden_origin", f"origin {origin[:200]!r} not allowed")

    def permits(self, origin: str, host: str) -> bool:
        """Same origin (the Host the browser called) or allow-listed; `null` never."""
        origin = origin.strip().rstrip("/").lower()
        if origin in self.allowed:
            return True
        try:
            netloc = urlsplit(origin).netloc
        except ValueError:
            return False
        return bool(netloc) and netloc == host.strip().lower()


# Hostile URLs


class UrlGuard:
    """NUL in a path or query value: 404 / 422 here, instead of a database error later."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        query = unquote(scope.get("query_string", b"").decode("latin-1"))
        problem = None
        if "\x00" in scope.get("path", ""):
            problem = (404, "not_found", "not found")
        elif "\x00" in query:
            problem = (422, "invalid_input", "query parameters must not contain NUL")
        if problem is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await refuse_websocket(receive, send)
        else:
            await send_error(send, *problem)


# Logs


class RedactSecrets(logging.Filter):
    """Replaces `token=...` (and the like) in a record's message and arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redact_arg(arg) for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {key: _redact_arg(value) for key, value in record.args.items()}
        return True


def redact(text: str) -> str:
    return _SECRET_PARAMS.sub(lambda m: m.group(1) + REDACTED, text)


def _redact_arg(arg: Any) -> Any:
    return redact(arg) if isinstance(arg, str) else arg


def install_log_redaction() -> None:
    """On uvicorn's access log (request lines) and error log (WebSocket lines); idempotent."""
    for name in ("uvicorn.access", "uvicorn.error", "uvicorn"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSecrets) for f in logger.filters):
            logger.addFilter(RedactSecrets())
