"""A route that matches only multipart bodies, beside a JSON route on the same path.

Tasks and experiments both take either JSON or multipart/form-data at one URL; registering
the multipart route first with this class keeps FastAPI's own JSON parsing for the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, status
from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import Scope


class MultipartRoute(APIRoute):
    """Matches only multipart bodies, so the JSON route keeps FastAPI's own parsing."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is Match.FULL and not is_multipart(scope):
            return Match.NONE, {}
        return match, child


def is_multipart(scope: Scope) -> bool:
    content_type = dict(scope.get("headers", [])).get(b"content-type", b"")
    return bytes(content_type).lower().startswith(b"multipart/form-data")


def add_multipart_route(
    router: APIRouter, endpoint: Callable[..., Any], response_model: type[Any]
) -> None:
    """Register `endpoint` for multipart POSTs to the router's root, answering 202.

    Call it before declaring the JSON route, as the first route that matches wins. It
    stays out of the OpenAPI schema: the JSON route documents the multipart body too
    (`openapi_extra=multipart_doc(...)`), so the path has one operation.
    """
    router.add_api_route(
        "",
        endpoint,
        methods=["POST"],
        status_code=status.HTTP_202_ACCEPTED,
        response_model=response_model,
        include_in_schema=False,
        route_class_override=MultipartRoute,
    )


def multipart_doc(
    required: list[str], properties: dict[str, Any], other_parts: dict[str, Any] | bool = False
) -> dict[str, Any]:
    """The JSON route's `openapi_extra` that documents its multipart body as well.

    `other_parts`: the schema of any part not in `properties` (False: none is taken)."""
    schema = {
        "type": "object",
        "required": required,
        "properties": properties,
        "additionalProperties": other_parts,
    }
    content = {"multipart/form-data": {"schema": schema}}
    return {"requestBody": {"required": True, "content": content}}
