"""Schemathesis over the OpenAPI document (RELIABILITY A-35): no 5xx, every error in the
contract's shape, schema-violating requests refused, auth never ignored.

Runs the real `sandhive serve` (no worker: tasks stay queued) and the `st` command
line with a bounded number of examples, a fixed seed (override with
SANDHIVE_FUZZ_SEED) and our own `error_shape` check (tests/security/st_hooks.py).
Every check runs, `positive_data_acceptance` (a schema-valid request must not be refused)
included, except on the few operations tests/security/schemathesis.toml names with why: a
request they refuse on purpose for what a JSON Schema cannot say (a webhook URL that points
inside the network, a scorer option its kind does not take, a dataset file that is not
JSONL). Elsewhere the document admits exactly what the server takes: optional parameters
are never null, cursors and sandbox paths carry the server's patterns, every 405 names all
its methods, every answer's media type is documented. The SSE routes are left out
(`STREAMS`: each call streams until the timeout); tests/security/test_auth_matrix.py covers
them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.config import Settings
from tests.security.api_process import running_api
from tests.security.conftest import TenantKeys

ST = Path(sys.executable).with_name("st")
MAX_EXAMPLES = os.environ.get("SANDHIVE_FUZZ_EXAMPLES", "30")
SEED = os.environ.get("SANDHIVE_FUZZ_SEED", "20261130")
OPEN_EPISODE = "create_episode_v1_episodes_post"
CREATE_SANDBOX = "create_sandbox_v1_sandboxes_post"
NEED_A_WORKER = (OPEN_EPISODE, CREATE_SANDBOX)
"""503 by design here: no worker runs to open an episode or start a sandbox (tests/episodes,
tests/sandboxes test them with one)."""
STREAMS = ("/v1/tasks/{task_id}/events", "/v1/experiments/{experiment_id}/events")
"""Left out: each call of a live stream lasts the whole request timeout (it ends when its
task or experiment does). tests/security/test_auth_matrix.py and tests/api cover them."""
EXCLUDED = os.environ.get("SANDHIVE_FUZZ_EXCLUDED", "")
CONFIG = Path(__file__).with_name("schemathesis.toml")
FUZZED_SERVER = {
    "rate_limit_per_s": 0,
    "scripted_profile": True,  # the document's examples name it (`make run` serves it too)
    "webhook_max_subscriptions": 100_000,  # a count of stored rows, not a request's shape
}
"""Where `positive_data_acceptance` is off, and why."""


@pytest.fixture
def api_url(keyed_settings: Settings, tmp_path: Path) -> Iterator[str]:
    settings = keyed_settings.model_copy(update=FUZZED_SERVER)
    log = tmp_path / "api.log"
    with running_api(settings, log) as base_url:
        yield base_url
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-5000:]  # nothing unhandled, not even unlogged


def test_schemathesis_finds_no_server_error_and_every_error_is_in_shape(
    api_url: str, tenant_keys: TenantKeys, tmp_path: Path
) -> None:
    assert ST.exists(), "schemathesis is a dev dependency: pip install -e '.[dev]'"
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.security.st_hooks", "NO_COLOR": "1"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    run = subprocess.run(
        [
            str(ST),
            "--config-file",
            str(CONFIG),
            "run",
            f"{api_url}/openapi.json",
            "--header",
            f"Authorization: Bearer {tenant_keys.a}",
            *(("--exclude-checks", EXCLUDED) if EXCLUDED else ()),
            "--max-examples",
            MAX_EXAMPLES,
            "--seed",
            SEED,
            *(arg for path in STREAMS for arg in ("--exclude-path", path)),
            *(arg for op in NEED_A_WORKER for arg in ("--exclude-operation-id", op)),
            # One worker thread: CPython 3.11 keeps the AST constructor's recursion depth
            # per interpreter, so two threads parsing at once can fail with "AST
            # constructor recursion depth mismatch" (gh-106905), and Hypothesis parses
            # lambdas' source to describe its strategies (a red CI run, seed 20261130).
            "--workers",
            "1",
            "--request-timeout",
            "10",
            "--generation-database",
            "none",
            "--no-color",
            "--report-dir",
            str(tmp_path / "report"),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = run.stdout + run.stderr
    print(output[-3000:])
    assert run.returncode == 0, output[-20000:]
    assert f"Tested: {fuzzed_operations(api_url)}" in output  # every operation but the stream


def fuzzed_operations(api_url: str) -> int:
    """The operations the spec publishes, less the excluded streams and those that need a
    worker."""
    paths = httpx.get(f"{api_url}/openapi.json", timeout=10).json()["paths"]
    methods = {"get", "put", "post", "delete", "patch", "head", "options"}
    return sum(
        1
        for path, operations in paths.items()
        if path not in STREAMS
        for method, operation in operations.items()
        if method in methods and operation.get("operationId") not in NEED_A_WORKER
    )
