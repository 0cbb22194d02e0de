"""The real `harbor run` on Sandhive's Harbor environment (`sandhive_client.harbor_env`).

Harbor 0.26.0 runs from the Debian 13 root `deploy/harbor-root.sh` builds (with this
checkout's client installed in its venv), under `chroot`, which shares the host's network:
its CLI reaches a real `sandhive serve` and `sandhive worker` on 127.0.0.1, with image
builds on. A small task written here is run by Harbor's `oracle` agent (its solve.sh) and its
`nop` agent (nothing) in sandboxes of the image the server built from its environment/, and
once more by `oracle` with `--ek build=replay` (the Dockerfile replayed in a sandbox of the
catalogue image, as on a server without builds); the rewards are read from Harbor's own
result files, and the sandboxes' command logs show what Harbor ran. Nothing leaves the
loopback (Harbor's telemetry off).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from sandhive_client import Command, SandboxInfo, Sandhive

from app.config import Settings
from app.db.engine import create_engine, create_sessions
from app.scripted import ScriptedLLMServer
from app.services import keys
from tests.e2e.fault_harness import cluster
from tests.support.harbor import harbor_root
from tests.support.settings import REDIS_URL, plain_settings

CHECKOUT_CLIENT = Path(__file__).resolve().parents[2] / "clients/python/src/sandhive_client"
INSTALLED_CLIENT = "opt/harbor/lib/python3.13/site-packages/sandhive_client"
ENVIRONMENT = "sandhive_client.harbor_env:SandhiveEnvironment"
HARBOR = "/opt/harbor/bin/harbor"
TENANT = "harbor-runs"

TASK_TOML = """\
schema_version = "1.4"

[metadata]

[agent]
timeout_sec = 120.0

[verifier]
timeout_sec = 120.0

[environment]
build_timeout_sec = 300.0
network_mode = "no-network"
cpus = 1
memory_mb = 1024
storage_mb = 256
"""
DOCKERFILE = """\
FROM sandhive-sandbox:latest
ARG GREETING=hello
ENV GREETING_FILE=/opt/greeting/message.txt
# the image's own files: needs a writable root filesystem
RUN mkdir -p /opt/greeting \\
    && echo "$GREETING from the Dockerfile" > "$GREETING_FILE"
WORKDIR /srv/app
COPY notes.txt .
RUN pwd > where.txt
CMD ["sleep", "infinity"]
"""
SOLVE = """\
#!/bin/bash
set -euo pipefail
cp "$GREETING_FILE" answer.txt
"""
TEST = """\
#!/bin/bash
if [ "$(cat /srv/app/answer.txt 2>/dev/null)" = "hello from the Dockerfile" ] \\
    && [ "$(cat /srv/app/where.txt)" = /srv/app ] \\
    && [ "$(cat /srv/app/notes.txt)" = "copied from the context" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


@dataclass(frozen=True)
class Server:
    base_url: str
    key: str


def _make_key(database_url: str) -> keys.CreatedKey:
    async def create() -> keys.CreatedKey:
        engine = create_engine(database_url)
        try:
            return await keys.create_key(create_sessions(engine), TENANT, "harbor tests")
        finally:
            await engine.dispose()

    return asyncio.run(create())


def _flush_redis() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.flushdb()
    except redis.ConnectionError as exc:
        pytest.fail(f"Redis unreachable at {REDIS_URL} ({exc})", pytrace=False)
    finally:
        client.close()


@pytest.fixture(scope="module")
def server(
    database_url: str,
    docker_image: str,
    scripted_llm: ScriptedLLMServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Server]:
    """`sandhive serve` and one `sandhive worker`, keys and image builds on, writable
    sandboxes allowed."""
    root = harbor_root()  # fails first, naming deploy/harbor-root.sh, when the root is missing
    stale = [
        path.name
        for path in sorted(CHECKOUT_CLIENT.glob("*.py"))
        if not (installed := root / INSTALLED_CLIENT / path.name).exists()
        or installed.read_bytes() != path.read_bytes()
    ]
    if stale:
        pytest.fail(
            f"the client in {root} is not this checkout's ({', '.join(stale)} differ): "
            "run `bash deploy/harbor-root.sh` (it re-installs it)",
            pytrace=False,
        )
    _flush_redis()
    settings: Settings = plain_settings(
        database_url,
        sandbox_image=docker_image,
        llm_base_url=scripted_llm.base_url,
        llm_model="unset",
        auth="keys",
        sandbox_allow_writable_rootfs=True,  # Harbor writes /logs; a replayed RUN /opt
        image_builds=True,
        image_build_timeout_s=120.0,
    )
    created = _make_key(database_url)
    log_dir: Path = tmp_path_factory.mktemp("sandhive-harbor")
    with cluster(settings, log_dir) as procs:
        procs.start_api()
        worker = procs.start_worker("harbor-worker")
        log = log_dir / "harbor-worker.log"
        deadline = time.monotonic() + 60
        while "ready with" not in log.read_text(errors="replace"):
            assert worker.poll() is None, f"the worker exited early:\n{procs.logs()}"
            assert time.monotonic() < deadline, f"the worker never got ready:\n{procs.logs()}"
            time.sleep(0.05)
        yield Server(procs.base_url, created.key)


@pytest.fixture
def workspace() -> Iterator[tuple[Path, str]]:
    """A directory inside the root (its host path, and its path under chroot)."""
    root = harbor_root()
    inside = f"/tmp/sandhive-harbor-{uuid.uuid4().hex[:10]}"
    host = root / inside.lstrip("/")
    host.mkdir(parents=True)
    try:
        yield host, inside
    finally:
        shutil.rmtree(host, ignore_errors=True)


def write_task(directory: Path, dockerfile: str = DOCKERFILE) -> None:
    files = {
        "task.toml": TASK_TOML,
        "instruction.md": "Copy the greeting the image holds into answer.txt.\n",
        "environment/Dockerfile": dockerfile,
        "environment/notes.txt": "copied from the context\n",
        "solution/solve.sh": SOLVE,
        "tests/test.sh": TEST,
    }
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if name.endswith(".sh"):
            path.chmod(0o755)


def harbor_run(
    server: Server, inside: str, agent: str, run: str, build: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/opt/harbor/bin:/usr/bin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "HARBOR_TELEMETRY": "0",
        "SANDHIVE_URL": server.base_url,
        "SANDHIVE_API_KEY": server.key,
    }
    argv = [
        "chroot", str(harbor_root()), "/usr/bin/env", "-i",
        *(f"{k}={v}" for k, v in env.items()),
        HARBOR, "run",
        "--path", f"{inside}/task",
        "--agent", agent,
        "--env", ENVIRONMENT,
        "--ek", "metadata=" + json.dumps({"harbor_run": run}),
        *(["--ek", f"build={build}"] if build else []),
        "--jobs-dir", f"{inside}/jobs",
        "--job-name", agent,
        "--n-concurrent", "1",
        "--quiet",
        "--yes",
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)


def trial_results(jobs: Path, job: str) -> list[dict[str, Any]]:
    found = [
        json.loads(path.read_text(encoding="utf-8"))
        for path in sorted((jobs / job).glob("*/result.json"))
    ]
    return found


def run_scored(
    server: Server, host: Path, inside: str, agent: str, run: str, build: str | None = None
) -> float:
    """`harbor run -a agent`, its one trial's reward (the trial must not have failed)."""
    started = time.monotonic()
    done = harbor_run(server, inside, agent, run, build)
    took = time.monotonic() - started
    assert done.returncode == 0, f"harbor run -a {agent}:\n{done.stdout}\n{done.stderr}"
    results = trial_results(host / "jobs", agent)
    assert len(results) == 1, (agent, done.stdout, done.stderr)
    failure = results[0]["exception_info"]
    assert failure is None, f"{agent}: " + json.dumps(failure, indent=1).replace("\\n", "\n")
    print(f"harbor run -a {agent} (build {build or 'auto'}): {took:.1f} s")
    return float(results[0]["verifier_result"]["rewards"]["reward"])


def command_logs(server: Server, run: str) -> tuple[list[SandboxInfo], list[list[Command]]]:
    """The run's sandboxes, each ended by the environment's stop(), and their command logs."""
    with Sandhive(server.base_url, api_key=server.key) as client:
        sandboxes = client.sandboxes.list(metadata={"harbor_run": run}).items
        for info in sandboxes:
            assert info.metadata["created_by"] == "harbor"
            assert info.metadata["harbor_session"]
            assert (info.status, info.end_reason) == ("ended", "deleted")  # stop() deleted it
        logs = [client.sandboxes.get(i.id).commands(limit=200).items for i in sandboxes]
    for commands in logs:  # Harbor's verifier ran its test.sh in each
        assert any("/tests/test.sh" in " ".join(c.argv or []) for c in commands), commands
    return sandboxes, logs


def ran_solve(logs: list[list[Command]]) -> bool:
    return any("/solution/solve.sh" in " ".join(c.argv or []) for cs in logs for c in cs)


def test_oracle_scores_1_and_nop_0_in_sandboxes_of_the_image_the_server_built(
    server: Server, workspace: tuple[Path, str]
) -> None:
    host, inside = workspace
    write_task(host / "task")
    run = uuid.uuid4().hex
    rewards = {agent: run_scored(server, host, inside, agent, run) for agent in ("oracle", "nop")}
    assert rewards == {"oracle": 1.0, "nop": 0.0}  # solve.sh found the image's ENV and WORKDIR

    sandboxes, logs = command_logs(server, run)
    assert len(sandboxes) == 2, sandboxes  # one per trial, both of the one image built
    [image] = {info.image for info in sandboxes}
    assert image.startswith("built/harbor-task-"), image  # harbor-<task>-<hash of environment/>
    for commands in logs:  # the Dockerfile's steps ran in Docker's build, not in the sandbox
        assert not [c for c in commands if "/opt/greeting" in " ".join(c.argv or [])], commands
    assert ran_solve(logs), "the oracle's solve.sh is in no sandbox's command log"
    with Sandhive(server.base_url, api_key=server.key) as client:
        built = client.images.get_build(image.removeprefix("built/"))
    assert "RUN mkdir -p /opt/greeting" in built.log, built.log
    assert "RUN pwd > where.txt" in built.log, built.log
    assert (built.workdir, built.env["GREETING_FILE"]) == ("/srv/app", "/opt/greeting/message.txt")


def test_oracle_scores_1_with_the_dockerfile_replayed_in_a_catalogue_sandbox(
    server: Server, workspace: tuple[Path, str]
) -> None:
    host, inside = workspace
    write_task(host / "task")
    run = uuid.uuid4().hex
    assert run_scored(server, host, inside, "oracle", run, build="replay") == 1.0

    [info], [commands] = command_logs(server, run)
    assert info.image == "default"
    # the Dockerfile's RUNs, through `sh -c`, in the WORKDIR of their time
    build = [c for c in commands if c.argv and c.argv[:2] == ["/bin/sh", "-c"]]
    assert [c.argv[2] for c in build if c.argv] == [  # continued as Docker joins lines
        'mkdir -p /opt/greeting     && echo "$GREETING from the Dockerfile" > "$GREETING_FILE"',
        "pwd > where.txt",
    ]
    assert [c.cwd for c in build] == ["/testbed", "/srv/app"]
    assert all(c.exit_code == 0 for c in build)
    assert ran_solve([commands])


@pytest.mark.parametrize(
    ("dockerfile", "build", "says", "sandboxes"),
    [
        (
            "FROM python:3.12-slim\nRUN true\n",
            None,
            (
                "environment/Dockerfile: line 1: FROM python:3.12-slim: not an image of this "
                "Sandhive's catalogue; FROM must name one of: ${BASE_IMAGE}, default, "
                "sandhive-sandbox:latest or an earlier stage",
            ),
            [],  # none made
        ),
        (
            "FROM default\nWORKDIR /work\nRUN echo building; echo no compiler >&2; exit 3\n",
            None,
            (
                "environment/Dockerfile: the image build failed: image 'harbor-task-",
                "did not build: The command '/bin/sh -c echo building; echo no compiler >&2; "
                "exit 3' returned a non-zero code: 3\n",
                "Step 3/4 : RUN echo building; echo no compiler >&2; exit 3\n",  # the log's end
            ),
            [],  # the build failed before any sandbox
        ),
        (  # a server build takes several stages; a replay cannot
            "FROM default AS build\nRUN make\nFROM default\nCOPY --from=build /out /out\n",
            "replay",
            ("line 3: multi-stage builds are not supported (a second FROM)",),
            [],
        ),
    ],
    ids=["from-outside-the-catalogue", "failing-run", "multi-stage-replayed"],
)
def test_a_dockerfile_the_sandbox_cannot_be_built_from_fails_the_trial_saying_why(
    server: Server,
    workspace: tuple[Path, str],
    dockerfile: str,
    build: str | None,
    says: tuple[str, ...],
    sandboxes: list[tuple[str, str]],
) -> None:
    host, inside = workspace
    write_task(host / "task", dockerfile)
    run = uuid.uuid4().hex
    done = harbor_run(server, inside, "nop", run, build)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    [result] = trial_results(host / "jobs", "nop")
    failure = result["exception_info"]
    assert failure is not None, result
    assert failure["exception_type"] == "SandboxBuildFailedError", failure
    message = failure["exception_message"]
    assert [part for part in says if part not in message] == [], message
    assert "\x1b" not in message  # Docker's colours taken out
    assert result["verifier_result"] is None
    with Sandhive(server.base_url, api_key=server.key) as client:
        made = client.sandboxes.list(metadata={"harbor_run": run}).items
    assert [(i.status, i.end_reason) for i in made] == sandboxes
