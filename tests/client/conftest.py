"""Fixtures of the client's tests: a real Sandhive (API + worker processes) to call.

`sandhive serve` and `sandhive worker` run as subprocesses on the test's
Postgres database, Redis, Docker and the scripted LLM; the client talks HTTP to
them as a user's service would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.config import Settings
from app.scripted import Script, Turn
from tests.e2e.fault_harness import Cluster, cluster

ANSWER = "338350"
STEPS = 4


@pytest.fixture
def live(settings: Settings, tmp_path: Path) -> Iterator[Cluster]:
    """The API and one worker, stopped after the test."""
    with cluster(settings.model_copy(update={"stream_keepalive_s": 1.0}), tmp_path) as procs:
        procs.start_api()
        procs.start_worker("client-worker")
        yield procs


def slow_answer_script(delay_s: float = 0.4) -> Script:
    """STEPS shell steps a little apart, then the answer file and submit: a stream of a few
    seconds with durable events all along."""
    steps = [
        Turn(tool="execute_bash", arguments={"command": f"echo step {i}"}, delay_s=delay_s)
        for i in range(STEPS)
    ]
    answer = Turn(
        tool="str_replace_editor",
        arguments={"command": "create", "path": "/testbed/output/answer.txt", "file_text": ANSWER},
    )
    return Script(turns=[*steps, answer, Turn(tool="submit", arguments={})])
