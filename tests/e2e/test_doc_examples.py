"""Every `sh`/`bash`/`python` block of README.md and docs/ that calls the API, run as pasted.

Against `sandhive serve` + `sandhive worker` configured as `make run` configures them: the
scripted profile alone, API keys on. What the reader would fill in is filled in the same
way every time: the server's address (`localhost:8000` is this test's port), `$KEY` and
`$SANDHIVE_API_KEY` (a key made with `sandhive keys create`, as the README says), and a
task id where a block shows `tsk_01J...` (a task of that key's tenant, finished). Every
`curl` of a block goes through a wrapper that reports each answer's status on stderr; a
block passes when it exits 0 and no answer is a 4xx or 5xx other than the ones its own text
says to expect (`EXPECTED`).

A block that cannot run here is named in `NOT_RUN` with why (a real model, a file of the
reader's, a host outside this machine); the list is checked against the docs both ways, so
a new block is run unless someone names it there.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.config import Settings
from tests.support.processes import (
    Service,
    free_port,
    run_app,
    running_service,
    settings_env,
)

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
API_ADDRESSES = ("localhost:8000", "127.0.0.1:8000")
MCP_ADDRESS = "127.0.0.1:8765"
"""docs/mcp.md's MCP endpoint: its Python block talks to the server its `sh` block starts."""
TASK_PLACEHOLDER = re.compile(r"tsk_01J?\.\.\.")
KEY_PLACEHOLDER = re.compile(r"\b(?:sk_|shv_|sk-)\.\.\.")
BLOCK = re.compile(r"^```(sh|bash|python)\n(.*?)^```", re.M | re.S)

NOT_RUN = {
    ("docs/api.md", "-d @experiment.json"): "posts experiment.json, a file of the reader's",
    ("docs/api.md", "file=@./table.csv"): "uploads ./table.csv and ./photo.png, the reader's",
    ("docs/calling-services.md", "hooks.example.com/sandhive"): (
        "subscribes https://hooks.example.com, a host outside this machine"
    ),
    ("docs/calling-services.md", "hooks.example.com/job/42"): (
        "names a webhook at https://hooks.example.com, a host outside this machine"
    ),
    ("docs/coming-from-llm-in-sandbox.md", "# before"): (
        "runs the paper's package (llm-in-sandbox) with a real model"
    ),
    ("docs/development.md", "make install"): "installs and runs the whole suite, this test in it",
    ("docs/experiments.md", "dataset=@rows.jsonl"): "uploads rows.jsonl, a file of the reader's",
    ("docs/experiments.md", "exp_.../events"): "follows an experiment of the reader's (exp_...)",
    ("docs/experiments.md", "$ID/regrade"): "regrades an experiment of the reader's ($ID)",
    ("docs/experiments.md", "sandhive experiment run ./benchmark/demo"): (
        "runs a task folder of the reader's (./benchmark/demo) with a real model"
    ),
    ("docs/harbor.md", "harbor run --path ./my-task"): (
        "runs Harbor (Python >= 3.12, not in this venv) on a task folder of the reader's; "
        "tests/harbor/test_harbor_run.py runs it from deploy/harbor-root.sh's root"
    ),
    ("docs/images.md", 'sandbox": {"image": "chem"'): (
        "asks for the chem image, which the operator builds first (docs/images.md)"
    ),
    ("docs/mcp.md", "sandhive mcp --transport http"): (
        "a server that runs until stopped: started for the Python block after it"
    ),
    ("docs/operations.md", "cp deploy/env.example .env"): (
        "a compose deployment; tests/e2e/test_compose.py runs it"
    ),
    ("docs/rl.md", "assistant = my_policy(messages, tools)"): (
        "tests/episodes/test_rl_doc_examples.py runs it (my_policy is the reader's model)"
    ),
    ("docs/rl.md", "async def rollout"): "tests/episodes/test_rl_doc_examples.py runs it",
}
"""Blocks that call the API but cannot run here: (page, a text only that block holds) -> why."""

EXPECTED = {("docs/api.md", "POST", "/cancel"): 409, ("docs/fork.md", "POST", "/fork"): 409}
"""Errors a block's own text announces: `# 202 with the task (409 once finished)`."""


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    lang: str
    code: str

    def not_run(self) -> list[tuple[str, str]]:
        """The NOT_RUN entries naming this block."""
        return [(page, text) for page, text in NOT_RUN if page == self.page and text in self.code]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def examples() -> list[Example]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in BLOCK.finditer(text):
            lang, code = match.groups()
            if any(address in code for address in (*API_ADDRESSES, MCP_ADDRESS)):
                line = text.count("\n", 0, match.start()) + 1
                found.append(Example(str(page.relative_to(ROOT)), line, lang, code))
    return found


def run_here() -> list[Example]:
    return [e for e in examples() if not e.not_run()]


def test_every_block_that_calls_the_api_is_run_or_named_with_why() -> None:
    named = {e: e.not_run() for e in examples() if e.not_run()}
    for example, entries in named.items():
        assert len(entries) == 1, f"{example} is named twice in NOT_RUN: {entries}"
        print(f"not run here: {example}: {NOT_RUN[entries[0]]}")
    found = [entry for entries in named.values() for entry in entries]
    assert sorted(found) == sorted(NOT_RUN), "NOT_RUN names a block the docs no longer have"
    assert len(run_here()) >= 6, [str(e) for e in run_here()]


@pytest.fixture
def bare(settings: Settings) -> Settings:
    """`make run`: the scripted profile alone, no real model, API keys on (the default),
    tenants' image builds on."""
    return settings.model_copy(
        update={
            "scripted_profile": True,
            "llm_base_url": "",
            "llm_model": "",
            "auth": "keys",
            "image_builds": True,
        }
    )


@pytest.fixture
def make_run(bare: Settings, tmp_path: Path) -> Iterator[Service]:
    with running_service(bare, tmp_path) as service:
        yield service


@pytest.fixture
def reader(make_run: Service, bare: Settings, tmp_path: Path) -> dict[str, str]:
    """What the reader fills in: a key, as the README makes it, and a finished task of it."""
    made = run_app("keys", "create", "--tenant", "me", env=settings_env(bare), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    with httpx.Client(
        base_url=make_run.base_url, headers={"Authorization": f"Bearer {key}"}
    ) as api:
        task = api.post("/v1/tasks", json={"prompt": "p"})
        assert task.status_code == 202, task.text
        deadline = time.monotonic() + 120
        while (done := api.get(f"/v1/tasks/{task.json()['id']}").json())["status"] in (
            "queued",
            "running",
        ):
            assert time.monotonic() < deadline, done
            time.sleep(0.2)
    assert done["status"] == "succeeded", done
    return {"KEY": key, "TASK": done["id"]}


CURL_WRAPPER = (
    "#!/bin/sh\nexec /usr/bin/curl --max-time 120 --write-out"
    " '%{stderr}doc-example %{http_code} %{method} %{url_effective}\\n' \"$@\"\n"
)
"""`curl` for the blocks: the real one, also writing each answer's status to stderr."""


def filled_in(code: str, base_url: str, reader: dict[str, str], mcp: str) -> str:
    host = base_url.removeprefix("http://")
    for address in API_ADDRESSES:
        code = code.replace(address, host)
    code = KEY_PLACEHOLDER.sub(reader["KEY"], code.replace(MCP_ADDRESS, mcp))
    return TASK_PLACEHOLDER.sub(reader["TASK"], code)


RUN_PYTHON = """
import ast, asyncio, sys
code = compile(sys.argv[1], "<doc example>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
ran = eval(code, {"__name__": "__main__"})
if asyncio.iscoroutine(ran):
    asyncio.run(ran)
"""
"""A Python block as a notebook or `python -m asyncio` runs it: a top-level `await` is fine."""


def test_the_examples_work_as_pasted(
    make_run: Service, bare: Settings, reader: dict[str, str], tmp_path: Path
) -> None:
    mcp = f"127.0.0.1:{free_port()}"
    failed = []
    with mcp_server(make_run.base_url, bare, reader, mcp, tmp_path):
        for number, example in enumerate(run_here()):
            home = tmp_path / str(number)
            problem = run_example(example, make_run.base_url, bare, reader, mcp, home)
            print(f"{example}: {problem or 'works'}")
            if problem:
                failed.append(problem)
    assert not failed, "\n\n".join(failed)


@contextmanager
def mcp_server(
    base_url: str, settings: Settings, reader: dict[str, str], mcp: str, home: Path
) -> Iterator[None]:
    """docs/mcp.md's `sandhive mcp --transport http` block, running until the test ends."""
    (block,) = [e for e in examples() if "sandhive mcp --transport http" in e.code]
    code = filled_in(block.code, base_url, reader, mcp).replace(
        "--port 8765", f"--port {mcp.rsplit(':', 1)[1]}"
    )
    with (home / "mcp.log").open("wb") as log:
        server = subprocess.Popen(
            ["bash", "-c", f"exec {code}"],
            env=reader_env(settings, reader, base_url, home),
            cwd=home,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, (home / "mcp.log").read_text()
            assert time.monotonic() < deadline, (home / "mcp.log").read_text()
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", int(mcp.rsplit(":", 1)[1]))) == 0:
                    break
            time.sleep(0.1)
        yield
    finally:
        server.terminate()
        server.wait(timeout=30)


def reader_env(
    settings: Settings, reader: dict[str, str], base_url: str, home: Path
) -> dict[str, str]:
    """The reader's shell: the server's settings, the key, and `curl` that reports statuses."""
    bin_dir = home / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir(parents=True)
        (home / ".venv").symlink_to(ROOT / ".venv")
        (bin_dir / "curl").write_text(CURL_WRAPPER)
        (bin_dir / "curl").chmod(0o755)
    return {
        **settings_env(settings),
        "PATH": f"{bin_dir}:{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}",
        "KEY": reader["KEY"],
        "SANDHIVE_API_KEY": reader["KEY"],
        "H": f"Authorization: Bearer {reader['KEY']}",
        "SANDHIVE_URL": base_url,
    }


def run_example(
    example: Example,
    base_url: str,
    settings: Settings,
    reader: dict[str, str],
    mcp: str,
    home: Path,
) -> str | None:
    """Run one block as a reader would in a fresh directory: None, or what went wrong."""
    code = filled_in(example.code, base_url, reader, mcp)
    env = reader_env(settings, reader, base_url, home)
    if example.lang == "python":
        command = [sys.executable, "-c", RUN_PYTHON, code]
    else:
        command = ["bash", "-eo", "pipefail", "-c", code]
    ran = subprocess.run(
        command, env=env, cwd=home, capture_output=True, text=True, timeout=180, check=False
    )
    said = f"{example}:\n{code}\n--- stdout\n{ran.stdout[-2000:]}\n--- stderr\n{ran.stderr[-2000:]}"
    if ran.returncode != 0:
        return f"exit {ran.returncode}: {said}"
    answers = re.findall(r"^doc-example (\d+) (\S+) (\S+)$", ran.stderr, re.M)
    if not answers and example.lang != "python":
        return f"no curl answered: {said}"
    for status, method, url in answers:
        allowed = [
            code
            for (page, verb, suffix), code in EXPECTED.items()
            if page == example.page and verb == method and url.split("?")[0].endswith(suffix)
        ]
        if int(status) >= 400 and int(status) not in allowed:
            return f"{method} {url} answered {status}: {said}"
    return None
