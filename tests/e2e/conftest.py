"""Fixtures of the end-to-end tests: a Redis server of the test's own, for the fault tests.

The fault tests (tests/e2e/test_faults_*.py) kill, restart or flush it freely;
the rest of the harness is in `tests.e2e.fault_harness`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.private_redis import PrivateRedis, running_redis


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A private redis-server, stopped after the test."""
    with running_redis(tmp_path) as server:
        yield server
