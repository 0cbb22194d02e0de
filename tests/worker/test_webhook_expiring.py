"""`task.expiring` from a real worker: sent `webhook_expiring_lead_s` before a running task's
`limits.timeout_s` runs out, with when it does (`expires_at`), then `task.finished` when
the time is up; nothing for a task that ends before its lead time."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import datetime

import httpx

from app.api.app import create_app
from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.api.conftest import serve
from tests.support.webhook_receiver import Receiver, receiver
from tests.worker.conftest import running_worker


async def events_of(rec: Receiver, task_id: str, count: int) -> list[dict]:
    deadline = time.monotonic() + 60
    while True:
        found = [json.loads(got.body) for got in rec.received]
        mine = [b for b in found if b["data"].get("id") == task_id]
        if len(mine) >= count:
            return mine
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.1)


async def test_a_task_running_out_of_time_is_announced_before_it_ends(
    settings: Settings, scripted_llm: ScriptedLLMServer
) -> None:
    slow = f"expiring-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(slow, Script([Turn("execute_bash", {"command": "sleep 30"})]))
    quick = f"quick-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(quick, Script([Turn("submit")]))
    expiring = settings.model_copy(
        update={
            "webhook_allowed_hosts": ["127.0.0.1"],
            "webhook_poll_s": 0.1,
            "webhook_expiring_lead_s": 2.0,
        }
    )
    async with receiver() as rec, serve(create_app(expiring)) as client:
        await subscribe(client, rec.url())
        async with running_worker(expiring):
            slow_id = await submit(client, slow, timeout_s=4)
            quick_id = await submit(client, quick, timeout_s=30)
            expiring_event, finished = await events_of(rec, slow_id, 2)
            await events_of(rec, quick_id, 1)
    assert (expiring_event["type"], finished["type"]) == ("task.expiring", "task.finished")
    assert expiring_event["data"]["status"] == "running"
    assert finished["data"]["finish_reason"] == "timeout"
    sent = datetime.fromisoformat(expiring_event["created_at"])
    expires_at = datetime.fromisoformat(expiring_event["data"]["expires_at"])
    assert 1.0 <= (expires_at - sent).total_seconds() <= 2.5  # the lead, give or take a poll
    ended = datetime.fromisoformat(finished["created_at"])
    assert abs((ended - expires_at).total_seconds()) < 2.0
    quick_events = [json.loads(g.body)["type"] for g in rec.received if quick_id in g.body.decode()]
    assert quick_events == ["task.finished"], "it ended long before its lead time"


async def subscribe(client: httpx.AsyncClient, url: str) -> None:
    events = ["task.expiring", "task.finished"]
    created = await client.post("/v1/webhooks", json={"url": url, "events": events})
    assert created.status_code == 201, created.text


async def submit(client: httpx.AsyncClient, model: str, *, timeout_s: int) -> str:
    body = {"prompt": "work", "llm": {"model": model}, "limits": {"timeout_s": timeout_s}}
    created = await client.post("/v1/tasks", json=body)
    assert created.status_code == 202, created.text
    return str(created.json()["id"])
