"""Remove the `/v1/sandboxes` containers a test left behind: its worker is SIGKILLed at the
end (`ready_worker`), so the sandboxes it held would live to their lifetime cap, under the
test session's instance label, where later tests of the same pytest worker list them."""

from __future__ import annotations

import subprocess

from app.sandbox.policy import SANDBOX_LABEL


def remove_sandboxes(instance: str) -> None:
    """Every `/v1/sandboxes` container of `instance` (the test database's name, unless a
    test's settings name another)."""
    found = subprocess.run(
        [
            "docker",
            "ps",
            "-aq",
            "--filter",
            f"label={SANDBOX_LABEL}",
            "--filter",
            f"label=sandhive.instance={instance}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if found:
        subprocess.run(["docker", "rm", "-f", *found], capture_output=True, check=False)
