"""Webhooks end to end: a task run by a real worker (sandbox, scripted model) is announced
to a loopback receiver, `task.started` then `task.finished`, by the worker's own sender."""

from __future__ import annotations

import asyncio
import json
import uuid

from app.api.app import create_app
from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.api.conftest import serve
from tests.support.webhook_receiver import receiver, verify
from tests.worker.conftest import running_worker


async def test_a_task_run_by_a_worker_sends_signed_started_and_finished(
    settings: Settings, scripted_llm: ScriptedLLMServer
) -> None:
    model = f"hook-{uuid.uuid4().hex[:8]}"
    bash = Turn(tool="execute_bash", arguments={"command": "echo 42 > output/answer.txt"})
    scripted_llm.add_script(model, Script(turns=[bash, Turn("submit")]))
    config = settings.model_copy(
        update={"webhook_allowed_hosts": ["127.0.0.1"], "webhook_poll_s": 0.1}
    )
    async with receiver() as rec, serve(create_app(config)) as client:
        created = await client.post(
            "/v1/webhooks",
            json={"url": rec.url(), "events": ["task.started", "task.finished"]},
        )
        secret = created.json()["secret"]
        async with running_worker(config):
            submitted = await client.post(
                "/v1/tasks", json={"prompt": "work", "llm": {"model": model}}
            )
            task_id = submitted.json()["id"]
            async with asyncio.timeout(120):
                await rec.wait_for(2)
        final = (await client.get(f"/v1/tasks/{task_id}")).json()
        assert final["status"] == "succeeded", final
        for got in rec.received:
            assert verify(secret, got.headers["sandhive-signature"], got.body)
        bodies = [json.loads(got.body) for got in rec.received]
        assert sorted(b["type"] for b in bodies) == ["task.finished", "task.started"]
        finished = next(b for b in bodies if b["type"] == "task.finished")
        assert finished["data"] == final
        started = next(b for b in bodies if b["type"] == "task.started")
        assert started["data"]["status"] == "running"
        log = (await client.get(f"/v1/tasks/{task_id}/webhooks")).json()["deliveries"]
        assert sorted((d["type"], d["status"]) for d in log) == [
            ("task.finished", "delivered"),
            ("task.started", "delivered"),
        ]


async def test_a_task_with_its_own_webhook_run_by_a_worker_gets_task_finished_there(
    settings: Settings, scripted_llm: ScriptedLLMServer
) -> None:
    """The task's URL gets only the events it asked for, signed with the tenant's secret;
    the subscription's URL keeps getting what the subscription asked for."""
    model = f"hook-{uuid.uuid4().hex[:8]}"
    bash = Turn(tool="execute_bash", arguments={"command": "echo 42 > output/answer.txt"})
    scripted_llm.add_script(model, Script(turns=[bash, Turn("submit")]))
    config = settings.model_copy(
        update={"webhook_allowed_hosts": ["127.0.0.1"], "webhook_poll_s": 0.1}
    )
    async with receiver() as tenants, receiver() as own, serve(create_app(config)) as client:
        created = await client.post(
            "/v1/webhooks", json={"url": tenants.url(), "events": ["task.started"]}
        )
        secret = created.json()["secret"]
        async with running_worker(config):
            submitted = await client.post(
                "/v1/tasks",
                json={
                    "prompt": "work",
                    "llm": {"model": model},
                    "webhook": {"url": own.url(path="/own"), "events": ["task.finished"]},
                },
            )
            assert submitted.status_code == 202, submitted.text
            task_id = submitted.json()["id"]
            async with asyncio.timeout(120):
                await own.wait_for(1)
                await tenants.wait_for(1)
        final = (await client.get(f"/v1/tasks/{task_id}")).json()
        assert final["status"] == "succeeded", final
        [got] = own.received
        assert got.path == "/own"
        assert verify(secret, got.headers["sandhive-signature"], got.body)
        body = json.loads(got.body)
        assert (body["type"], body["data"]) == ("task.finished", final)
        assert [json.loads(g.body)["type"] for g in tenants.received] == ["task.started"]
        log = (await client.get(f"/v1/tasks/{task_id}/webhooks")).json()["deliveries"]
        assert sorted((d["type"], d["url"], d["status"]) for d in log) == [
            ("task.finished", own.url(path="/own"), "delivered"),
            ("task.started", tenants.url(), "delivered"),
        ]
