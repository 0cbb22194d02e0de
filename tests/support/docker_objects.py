"""`docker <kind> inspect` for tests that wait for Docker to remove something."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

TRIES = 10


def docker_inspect(kind: str, name: str) -> dict[str, Any] | None:
    """The object's inspection, or None once Docker says there is no such object.

    Any other failure (a daemon slow to answer on a loaded machine) is tried again, then
    raised: read as "gone", it let a test go on while the container still ran (a red CI
    run, 2026-12-05: a command ran in a sandbox the test thought removed).
    """
    for _ in range(TRIES):
        out = subprocess.run(
            ["docker", kind, "inspect", name], capture_output=True, text=True, check=False
        )
        if out.returncode == 0:
            found: dict[str, Any] = json.loads(out.stdout)[0]
            return found
        if "no such" in out.stderr.lower():
            return None
        time.sleep(0.5)
    raise AssertionError(f"docker {kind} inspect {name} failed: {out.stderr.strip()}")
