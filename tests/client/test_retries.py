"""Retries on 429 honour Retry-After, within bounds: against the API's real rate limiter."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandhive_client import AsyncSandhive, NotFound, RateLimited, Retries, Sandhive

from app.config import Settings
from tests.e2e.fault_harness import Cluster, cluster


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
