"""A scripted LLM server private to the LLM tests (they provoke failures on purpose)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.scripted import ScriptedLLMServer


@pytest.fixture(scope="module")
def llm_server() -> Iterator[ScriptedLLMServer]:
    """Not the session `scripted_llm`: its `failures` must stay clean for other tests."""
    with ScriptedLLMServer() as server:
        yield server
