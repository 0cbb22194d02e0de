"""Query strings are checked, not skimmed: a parameter the route does not take is a 422.

A misspelt filter (`?stauts=failed`) would otherwise answer the unfiltered list
as if it had been applied. Routes opt in with `dependencies=[known_query_only()]`;
the names allowed are the route's own declared query parameters (read from the
route FastAPI matched) plus `also`, for names read outside the signature, plus any name
starting with one of `families` (`metadata.` for `metadata.KEY=VALUE` filters). The
caller's key is checked first, so a request without one is still a 401.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from app.api.deps import Tenant
from app.errors import InvalidInput

MAX_NAMED = 10
"""Unknown names listed in one answer (the query string is the client's, of any length)."""
MAX_NAME_CHARS = 100


def known_query_only(*also: str, families: tuple[str, ...] = ()) -> Any:
    """A route dependency refusing query parameters that are neither declared nor in `also`
    nor start with one of `families`."""

    async def check(request: Request, _tenant: Tenant) -> None:
        allowed = _declared(request.scope.get("route")) | set(also)
        unknown = [
            name
            for name in dict.fromkeys(request.query_params)
            if name not in allowed and not (families and name.startswith(families))
        ]
        if unknown:
            raise _refusal(unknown)

    return Depends(check)


def _declared(route: object) -> frozenset[str]:
    if not isinstance(route, APIRoute):
        return frozenset()
    return frozenset(_query_names(route.dependant))


def _query_names(dependant: Dependant) -> set[str]:
    """The query parameters of a route's signature and of every dependency below it."""
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def _refusal(unknown: list[str]) -> InvalidInput:
    names = [name[:MAX_NAME_CHARS] for name in unknown[:MAX_NAMED]]
    listed = ", ".join(names) + (", ..." if len(unknown) > MAX_NAMED else "")
    plural = "s" if len(unknown) > 1 else ""
    details = [
        {"loc": ["query", name], "msg": "unknown query parameter", "type": "extra_forbidden"}
        for name in names
    ]
    return InvalidInput(f"unknown query parameter{plural}: {listed}", details=details)
