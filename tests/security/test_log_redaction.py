"""A key passed as `?token=` never reaches a log line (RELIABILITY A-33), with the real
`sandhive serve` (uvicorn's own access and WebSocket logging) in a subprocess."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets

from app.config import Settings
from tests.security.api_process import running_api
from tests.security.conftest import TenantKeys


@pytest.fixture
def api(keyed_settings: Settings, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`sandhive serve` on a free port: (base URL, its log file)."""
    log = tmp_path / "api.log"
    with running_api(keyed_settings, log) as base_url:
        yield base_url, log


async def test_token_in_the_url_is_redacted_from_every_log_line(
    api: tuple[str, Path], tenant_keys: TenantKeys
) -> None:
    base_url, log = api
    canary_bad = "shv_0123456789abcdef_CANARYCANARYCANARYCANARYCANARYCANARYCANARYC"
    async with httpx.AsyncClient(base_url=base_url) as client:
        created = await client.post(
            "/v1/tasks", json={"prompt": "p"}, headers={"Authorization": f"Bearer {tenant_keys.a}"}
        )
        task_id = created.json()["id"]
        await client.get(f"/v1/tasks?token={canary_bad}&limit=1")
    ws_base = base_url.replace("http://", "ws://")
    for token in (tenant_keys.a, canary_bad):
        url = f"{ws_base}/v1/tasks/{task_id}/stream?after=0&token={token}"
        async with asyncio.timeout(20), websockets.connect(url) as ws:
            if token == tenant_keys.a:
                assert "task.queued" in str(await ws.recv())
            else:
                await ws.wait_closed()
                assert ws.close_code == 4401
    await asyncio.sleep(0.5)  # let the log lines reach the file
    text = log.read_text(errors="replace")
    assert "WebSocket /v1/tasks/" in text  # the lines that would carry it are there ...
    assert "token=[redacted]" in text
    for secret in (tenant_keys.a, canary_bad, tenant_keys.a.split("_", 2)[2], "CANARY"):
        assert secret not in text  # ... without it
