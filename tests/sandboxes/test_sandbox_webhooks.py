"""`sandbox.created`, `sandbox.expiring` and `sandbox.ended`, sent by a real worker to a real
loopback receiver as a sandbox starts, nears its deadline (once per deadline: an extension
announces the new one) and goes; each carries the sandbox as GET returns it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from app.api.app import create_app
from app.config import Settings
from tests.api.conftest import serve
from tests.api.test_webhooks import FAST_RETRIES, subscribe
from tests.sandboxes.conftest import ALICE, create
from tests.support.processes import ready_worker
from tests.support.webhook_receiver import receiver


async def test_a_sandboxs_life_is_announced_to_its_tenants_webhooks(
    make_sandbox_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_sandbox_settings(
        webhook_allowed_hosts=["127.0.0.1"],
        webhook_poll_s=0.1,
        webhook_expiring_lead_s=5.0,
        **FAST_RETRIES,
    )
    events = ["sandbox.created", "sandbox.expiring", "sandbox.ended"]
    with ready_worker(settings, tmp_path / "worker.log"):
        async with receiver() as rec, serve(create_app(settings)) as api:
            api.timeout = httpx.Timeout(120.0)
            await subscribe(api, rec.url(), events, headers=ALICE)
            sid = (await create(api, ttl_s=10))["id"]

            def received() -> list[dict[str, Any]]:
                return [json.loads(r.body) for r in rec.received]

            async def until(count: int, kind: str) -> None:
                deadline = time.monotonic() + 30
                while sum(b["type"] == kind for b in received()) < count:
                    assert time.monotonic() < deadline, [b["type"] for b in received()]
                    await asyncio.sleep(0.1)

            await until(1, "sandbox.expiring")  # 5 s before its first deadline
            moved = await api.post(f"/v1/sandboxes/{sid}/ttl", json={"ttl_s": 3}, headers=ALICE)
            assert moved.status_code == 200, moved.text
            await until(2, "sandbox.expiring")  # the new deadline, announced again
            await until(1, "sandbox.ended")
            bodies = received()
            assert sorted(b["type"] for b in bodies) == sorted(
                ["sandbox.created", "sandbox.expiring", "sandbox.expiring", "sandbox.ended"]
            )
            assert {b["data"]["id"] for b in bodies} == {sid}
            expiring = [b["data"]["expires_at"] for b in bodies if b["type"] == "sandbox.expiring"]
            assert len(set(expiring)) == 2, "one announcement per deadline"
            ended = (await api.get(f"/v1/sandboxes/{sid}", headers=ALICE)).json()
            (last,) = [b for b in bodies if b["type"] == "sandbox.ended"]
            assert last["data"] == ended
            assert ended["end_reason"] == "expired"
            assert all("webhook-signature" in r.headers for r in rec.received)
