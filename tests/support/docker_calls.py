"""Docker API calls counted on their way to the real daemon (tests/worker/test_docker_calls.py,
tests/sandbox/test_channel_collect.py). Not a mock: every call still reaches dockerd and
is answered by it; the counter only notes it.

It wraps `aiodocker.Docker._do_query`, the one method every aiodocker request (JSON calls,
archive streams, hijacked exec streams) goes through, and records the call's method and
path with ids blanked (`containers/{id}/start`).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import aiodocker
import pytest

PER_SANDBOX = re.compile(r"^(containers/create|containers/\{id\}(/|$)|exec/\{id\}/)")
"""Calls about one sandbox, as opposed to worker-wide ones (pings, the reaper's listings)."""
ID = re.compile(r"(?<=/)[0-9a-f]{12,64}(?=/|$)")


class DockerCalls:
    """(method, path with ids as {id}) of every request sent to the daemon while active."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()

    def per_sandbox(self) -> Counter[tuple[str, str]]:
        return Counter({k: n for k, n in self.calls.items() if PER_SANDBOX.match(k[1])})

    def record(self, method: str, path: object) -> None:
        text = str(path).lstrip("/")
        self.calls[(method.upper(), ID.sub("{id}", text.split("?", 1)[0]))] += 1


@pytest.fixture
def docker_calls(monkeypatch: pytest.MonkeyPatch) -> DockerCalls:
    """Counts this test's Docker API calls (the whole process's, while the test runs)."""
    counter = DockerCalls()
    real = aiodocker.Docker._do_query

    async def counting(self: aiodocker.Docker, path: Any, method: str, **kw: Any) -> Any:
        counter.record(method, path)
        return await real(self, path, method, **kw)

    monkeypatch.setattr(aiodocker.Docker, "_do_query", counting)
    return counter
