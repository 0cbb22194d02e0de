"""Every non-2xx answer has the contract's shape, whatever produced it."""

from __future__ import annotations

import httpx

from app.api.app import create_app
from app.config import Settings
from tests.api.conftest import assert_error, serve


async def test_unknown_route_is_404(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/nothing-here"), 404, "not_found")


async def test_wrong_method_is_405_with_allow(client: httpx.AsyncClient) -> None:
    response = await client.delete("/v1/tasks")
    assert_error(response, 405, "method_not_allowed")
    assert response.headers["allow"]


async def test_an_unexpected_exception_is_500_without_a_trace(api_settings: Settings) -> None:
    app = create_app(api_settings)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret internals at /srv/app.py line 3")

    async with serve(app, raise_errors=False) as client:
        response = await client.get("/boom")
    error = assert_error(response, 500, "internal")
    assert "secret" not in response.text
    assert "Traceback" not in response.text
    assert error["details"] is None


async def test_with_api_keys_on_a_call_without_a_key_is_401(api_settings: Settings) -> None:
    keyed = api_settings.model_copy(update={"auth": "keys"})
    async with serve(create_app(keyed)) as client:
        missing = await client.get("/v1/tasks")
        presented = await client.get("/v1/tasks", headers={"Authorization": "Bearer sk-1"})
        health = await client.get("/healthz")
    assert "missing" in assert_error(missing, 401, "unauthorized")["message"]
    assert_error(presented, 401, "unauthorized")
    assert health.status_code == 200


async def test_openapi_describes_the_routes(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    assert spec["info"]["title"] == "Sandhive"
    assert {"/v1/tasks", "/v1/tasks/{task_id}", "/v1/tasks/{task_id}/artifacts.zip"} <= set(
        spec["paths"]
    )
    assert "202" in spec["paths"]["/v1/tasks"]["post"]["responses"]
