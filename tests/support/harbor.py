"""Harbor's own code, run from the Debian 13 root filesystem `deploy/harbor-root.sh` builds
(Harbor needs Python >= 3.12; this host has 3.11): the judge of what Sandhive writes in
Harbor's formats.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(os.environ.get("SANDHIVE_HARBOR_ROOT", "/var/lib/sandhive/harbor-root"))
PYTHON = "/opt/harbor/bin/python"
VALIDATE = """
import json, sys
from harbor.models.trajectories import Trajectory
out = []
for path in sys.argv[1:]:
    try:
        Trajectory.model_validate_json(open(path, encoding="utf-8").read())
        out.append(None)
    except Exception as error:
        out.append(str(error))
print(json.dumps(out))
"""


def harbor_root() -> Path:
    """The root filesystem, or the test fails saying how to build it."""
    if not (ROOT / PYTHON.lstrip("/")).exists():
        pytest.fail(f"no Harbor root filesystem in {ROOT}: run `bash deploy/harbor-root.sh`")
    return ROOT


def atif_problems(documents: list[dict[str, Any]]) -> list[str | None]:
    """Per document, what `harbor.models.trajectories.Trajectory` says is wrong (None: valid)."""
    root = harbor_root()
    folder = Path("tmp") / f"atif-{uuid.uuid4().hex[:8]}"
    (root / folder).mkdir(parents=True)
    paths = []
    for n, document in enumerate(documents):
        (root / folder / f"{n}.json").write_text(json.dumps(document), encoding="utf-8")
        paths.append(f"/{folder}/{n}.json")
    done = subprocess.run(
        ["chroot", str(root), PYTHON, "-c", VALIDATE, *paths],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found: list[str | None] = json.loads(done.stdout)
    return found
