"""Retries on 429 honour Retry-After, within bounds: against the API's real rate limiter."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandhive_client import AsyncSandhive, NotFound, RateLimited, Retries, Sandhive, Unavailable

from app.config import Settings
from tests.e2e.fault_harness import Cluster, cluster
from tests.llm.support import planned_server


@pytest.fixture
def limited(settings: Settings, tmp_path: Path) -> Iterator[Cluster]:
    """The API alone, allowing its tenant one request per second (burst 1)."""
    tight = settings.model_copy(update={"rate_limit_per_s": 1.0, "rate_limit_burst": 1})
    with cluster(tight, tmp_path) as procs:
        procs.start_api()
        yield procs


def test_a_429_is_retried_after_its_retry_after(limited: Cluster) -> None:
    # Its own backoff (10 ms, doubling) alone would spend every retry inside the second
    # the limiter asks for: only waiting for Retry-After gets the calls through.
    retries = Retries(max_retries=4, default_wait_s=0.01)
    with Sandhive(limited.base_url, retries=retries) as client:
        started = time.monotonic()
        for _ in range(3):
            assert client.tasks.list(limit=1).items == []
        assert time.monotonic() - started >= 1.8  # 2 waits of about a second each

    with Sandhive(limited.base_url, retries=Retries(max_retries=0)) as client:
        with pytest.raises(RateLimited) as limited_error:
            client.tasks.list(limit=1)  # the bucket is empty: the loop just took its token
    error = limited_error.value
    assert (error.status, error.code) == (429, "too_many_requests")
    assert error.retry_after_s is not None
    assert error.retry_after_s >= 1


def test_retries_are_bounded(limited: Cluster) -> None:
    time.sleep(1.1)  # a full bucket: one token
    with Sandhive(limited.base_url, retries=Retries(max_retries=2, max_wait_s=0.05)) as client:
        client.tasks.list(limit=1)
        started = time.monotonic()
        with pytest.raises(RateLimited):
            client.tasks.list(limit=1)
        assert time.monotonic() - started < 0.9  # Retry-After (1 s) was capped at 50 ms


async def test_the_async_client_retries_too(limited: Cluster) -> None:
    async with AsyncSandhive(limited.base_url, retries=Retries(default_wait_s=0.01)) as client:
        for _ in range(2):
            with pytest.raises(NotFound):
                await client.tasks.get("tsk_nope")  # a 429 first, then the real answer


async def test_a_sandbox_command_is_not_sent_again_after_a_503() -> None:
    """A 503 may come after the command ran (its worker lost as it answered): sending it
    again could run it twice, so the client gives it to the caller; a read is retried."""
    sandbox_id = "sbx_01JZZZZZZZZZZZZZZZZZZZZZZZ"
    info = {
        "id": sandbox_id,
        "status": "running",
        "image": "default",
        "network": "none",
        "cpus": 1.0,
        "memory_mb": 512,
        "disk_mb": 1024,
        "allow_domains": [],
        "read_only_rootfs": True,
        "metadata": {},
        "workdir": "/testbed",
        "created_at": "2026-12-04T08:00:00+00:00",
        "expires_at": "2026-12-04T08:10:00+00:00",
        "ended_at": None,
        "end_reason": None,
        "error": None,
        "commands": 0,
    }
    unavailable = {"error": {"code": "unavailable", "message": "lost", "details": None}}

    async def found(_body: dict[str, Any]) -> tuple[int, str, bytes]:
        return 200, "application/json", json.dumps(info).encode()

    async def lost(_body: dict[str, Any]) -> tuple[int, str, bytes]:
        return 503, "application/json", json.dumps(unavailable).encode()

    async with planned_server([found, lost]) as (url, seen):
        fast = Retries(max_retries=2, default_wait_s=0.01)
        async with AsyncSandhive(url.removesuffix("/v1"), retries=fast) as client:
            sandbox = await client.sandboxes.get(sandbox_id)
            with pytest.raises(Unavailable):
                await sandbox.exec(["touch", "/tmp/once"])
            assert len(seen.bodies) == 2, "the command went once"
            with pytest.raises(Unavailable):
                await client.sandboxes.get(sandbox_id)
            assert len(seen.bodies) == 2 + 3, "a read goes again (two retries)"
