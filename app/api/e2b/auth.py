"""Who calls the E2B API, and its errors in E2B's shape.

The SDK sends the API key as `X-API-KEY` to the control plane, and the sandbox's
`envdAccessToken` as `X-Access-Token` to envd; Sandhive gives the caller's own key back as
that token, so both are Sandhive API keys and a tenant reaches only its own sandboxes (an
unknown or another tenant's sandbox is E2B's not-found). `Authorization: Bearer` works too.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec

from fastapi.responses import JSONResponse
from starlette.requests import HTTPConnection
from starlette.responses import Response

from app.api.deps import presented_key, tenant_of, within_rate
from app.errors import AppError
from app.resources import Resources
from app.services import keys

P = ParamSpec("P")
KEY_HEADERS = ("x-api-key", "x-access-token")


def e2b_key(conn: HTTPConnection) -> str | None:
    """The key the SDK sent: `X-API-KEY`, `X-Access-Token`, or a bearer key."""
    for name in KEY_HEADERS:
        value = conn.headers.get(name, "").strip()
        if value:
            return value
    return presented_key(conn)


async def e2b_tenant(conn: HTTPConnection, res: Resources) -> str:
    """The caller's tenant, within its request rate; Unauthorized without a valid key."""
    missing = "missing API key: set E2B_API_KEY to a Sandhive API key"
    tenant = await tenant_of(conn, res, e2b_key(conn), missing)
    await within_rate(res, tenant)
    return tenant


def key_id(conn: HTTPConnection, res: Resources) -> str | None:
    """The id of the key that made the request, for the sandbox's command log: `admin` for
    the operator's key, none while auth is disabled (the SDK sends some key regardless)."""
    key = e2b_key(conn)
    if key is None or res.settings.auth == "disabled":
        return None
    return keys.parse_key(key) or "admin"


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """E2B's error body: `{"code", "message"}` (the SDK reads `message`)."""
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)


def e2b_errors(route: Callable[P, Awaitable[Response]]) -> Callable[P, Awaitable[Response]]:
    """Sandhive's errors as E2B's: the same status, its body in E2B's shape."""

    @functools.wraps(route)
    async def answer(*args: P.args, **kwargs: P.kwargs) -> Response:
        try:
            return await route(*args, **kwargs)
        except AppError as exc:
            return error(exc.status, exc.message, exc.headers() or None)

    return answer
