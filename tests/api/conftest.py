"""Drive the real app in-process: its lifespan runs, and its state reaches every request.

`httpx.ASGITransport` does not run the ASGI lifespan, so `serve` does what a
server does: enter the app's lifespan and copy its state into each scope.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from app.api.app import create_app
from app.config import Settings
from tests.support.experiments import ADMIN_KEY


@asynccontextmanager
async def serve(app: FastAPI, *, raise_errors: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """A client on `app`, with its lifespan started before and stopped after."""
    async with app.router.lifespan_context(app) as state:

        async def with_state(scope: Scope, receive: Receive, send: Send) -> None:
            scope["state"] = dict(state or {})
            await app(scope, receive, send)

        transport = httpx.ASGITransport(app=with_state, raise_app_exceptions=raise_errors)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://sandhive.test"
        ) as client:
            yield client


@pytest.fixture
def api_settings(make_settings: Callable[..., Settings]) -> Settings:
    """Real Postgres and Redis; an LLM profile that is configured but never called."""
    return make_settings()


@pytest.fixture
async def client(api_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(create_app(api_settings)) as client:
        yield client


@pytest.fixture
async def keyed_client(make_settings: Callable[..., Settings]) -> AsyncIterator[httpx.AsyncClient]:
    """The API requiring API keys, `ADMIN_KEY` its admin key (`as_tenant` acts for a tenant)."""
    async with serve(create_app(make_settings(auth="keys", admin_api_key=ADMIN_KEY))) as client:
        yield client


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The contract's error shape, and nothing else in the body."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str)
    assert body["error"]["message"]
    error: dict[str, Any] = body["error"]
    return error
