"""Settings for tests: the one base every test's `Settings` is built on.

`plain_settings` is the factory; the root `make_settings` fixture (tests/conftest.py)
binds it to the clean test database, and the root `settings` fixture adds the
Docker image and the scripted LLM on top.
"""

from __future__ import annotations

import os
from typing import Any

from app.config import Settings

WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
"""This pytest process's name under pytest-xdist (`gw0`, `gw1`, …); `gw0` when run alone."""
_REDIS_DBS = ((15, 12), (14, 9), (13, 8), (10, 7))
"""Per xdist worker: its Redis DB and a spare one, so that workers never flush each other's
(up to 4 workers; a worker xdist starts in place of a crashed one takes a free pair, `gw3`,
or, past 4, shares one)."""
_SLOT = int(WORKER.removeprefix("gw")) % len(_REDIS_DBS)
REDIS_URL = os.environ.get(
    "SANDHIVE_TEST_REDIS_URL", f"redis://127.0.0.1:6379/{_REDIS_DBS[_SLOT][0]}"
)
SPARE_REDIS_URL = REDIS_URL.rsplit("/", 1)[0] + f"/{_REDIS_DBS[_SLOT][1]}"
"""A second database on the test Redis, for tests that need one nobody else flushes."""

BASE_TEST_SETTINGS: dict[str, Any] = {
    "redis_url": REDIS_URL,
    "llm_base_url": "http://127.0.0.1:9/v1",
    "llm_model": "test-model",
    "sandbox_image": "sandhive-sandbox:test",
    "auth": "disabled",  # every call is tenant `default`; tests/security covers keys
    "rate_limit_per_s": 0,
}
"""Test Redis, a `default` LLM profile nobody calls, no keys, no rate limit."""


def plain_settings(database_url: str, **overrides: Any) -> Settings:
    """Settings on `database_url` and the test Redis, with a `default` LLM profile nobody calls."""
    return Settings(
        _env_file=None, **{**BASE_TEST_SETTINGS, "database_url": database_url, **overrides}
    )
