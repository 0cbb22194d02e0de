"""Fixtures for service tests: Settings without Docker (`sessions` is the root one)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.config import Settings


@pytest.fixture
def service_settings(make_settings: Callable[..., Settings]) -> Settings:
    """Real Postgres and Redis; an LLM profile that is configured but never called."""
    return make_settings()
