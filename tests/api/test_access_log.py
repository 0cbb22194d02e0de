"""`SANDHIVE_API_ACCESS_LOG`: uvicorn's line per request, on by default, none when off.

The server is built from `server_options`, as `sandhive serve` builds it, at INFO.
"""

from __future__ import annotations

import logging

import httpx
import pytest
from redis.asyncio import Redis

from app.api.server import server_options
from tests.api.live_server import live_server
from tests.support.settings import plain_settings


async def access_lines(settings_db: str, caplog: pytest.LogCaptureFixture, **values: bool) -> list:
    settings = plain_settings(settings_db, **values)
    # An earlier server in this process may have cut the logger off (uvicorn does, for
    # access_log=False): start from the state `logs.setup` leaves it in.
    logging.getLogger("uvicorn.access").propagate = True
    with caplog.at_level(logging.INFO, logger="uvicorn.access"):
        async with live_server(settings, **server_options(settings), log_level="info") as server:
            async with httpx.AsyncClient(base_url=server.base_url) as client:
                assert (await client.get("/healthz")).status_code == 200
    return [r.getMessage() for r in caplog.records if r.name == "uvicorn.access"]


async def test_each_request_is_logged_by_default(
    clean_db: str, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    lines = await access_lines(clean_db, caplog)
    assert any("GET /healthz" in line and "200" in line for line in lines), lines


async def test_no_access_line_when_the_setting_is_off(
    clean_db: str, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    assert await access_lines(clean_db, caplog, api_access_log=False) == []
