"""A key passed as `?token=` never reaches a log line (RELIABILITY A-33), with the real
`sandhive serve` (uvicorn's own access and WebSocket logging) in a subprocess."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets

from app.config import Settings
from tests.security.conftest import TenantKeys
from tests.support.processes import free_port, settings_env


def wait_ready(base_url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")
        try:
            if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"API not ready:\n{log.read_text(errors='replace')}")


@pytest.fixture
def api(keyed_settings: Settings, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`sandhive serve` on a free port: (base URL, its log file)."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    log = tmp_path / "api.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--port", str(port)],
            env=settings_env(keyed_settings),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(base_url, proc, log)
        yield base_url, log
    finally:
        proc.terminate()
        proc.wait(timeout=20)


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
    for secret in (tenant_keys.a, canary_bad, tenant_keys.a.rsplit("_", 1)[1], "CANARY"):
        assert secret not in text  # ... without it
