"""Score one answer with a user's `compute_score`, in a fresh sandbox of its own.

The user's code is hostile until proven otherwise, so it runs in a container made for this
one answer with the tasks' hardening (`app.sandbox.policy`: no network, capabilities
dropped, no-new-privileges, read-only image, no host mounts, only the reference's base
environment) and tighter limits: its memory, a small pids limit (a fork bomb), small tmpfs
scratch dirs (a gigabyte write), a wall clock after which the container is removed, and at
most `output_bytes` of each output stream kept (head and tail). The runner
(`runner`, root) runs the code in a process of its own
(`code`) that drops to `nobody` before the code is compiled.

The answer is scored text, and the code may print it: a result is only ever the runner's
report, the last line of stdout carrying this run's key (a secret the code cannot read),
from a runner that then exited 0; what the code's process returned reaches the runner on a
socket on which the kernel names the sender, never through output (issue #28). Whatever the code
does, this function returns a `Score` or raises `ScorerError`, with the run's output in its
`detail` for debugging, and the container is gone when it returns (or is cancelled); its
deadline removes it even if this process dies first. Docker failing to make or run the
container is no verdict on the answer: that is a `SandboxError`, which the caller tries
again (an experiment's item) or stores as an `infrastructure` error (an episode's reward).
Called by the worker's scoring loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import math
import secrets
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.agent.types import ExecResult
from app.errors import SandboxError
from app.sandbox.capture import OutputCapture
from app.sandbox.docker import DockerHost, DockerSandbox
from app.sandbox.policy import SandboxConfig
from app.sandbox.reaper import CREATED_LABEL
from app.scoring.python_code import PythonScorer
from app.scoring.types import Score, ScorerError

log = logging.getLogger(__name__)

SCORER_LABEL = "sandhive.scorer"
"""On every python scorer's sandbox (value `python`), with its creation time. No task label:
this module removes it, and its deadline (minutes) if this process died once it started.
The worker adds its instance and worker labels (`labels`), so a container left between
create and start (the deadline not yet running) is the reaper's once that worker is gone."""
RUN_LABEL = "sandhive.scorer_run"
"""One value per run (also in the result's `detail["sandbox_run"]`): finds exactly its container."""
RUNNER_SOURCE = Path(__file__).with_name("runner.py").read_text()
CODE_SOURCE = Path(__file__).with_name("code.py").read_text()
REPORT_TAIL_BYTES = 65536
"""Of stdout, kept apart from what is shown: the report is in it, whatever was truncated."""
WORKDIR = "/scorer"
CREATE_TIMEOUT_S = 120.0
"""Making and starting the container; not part of the scorer's own `timeout_s`."""
REMOVE_WAIT_S = 10.0
"""After a timeout the container is removed first; the exec then ends by itself this soon."""
DEADLINE_MARGIN_S = 60.0
LINGER_S = 1.0
"""Once the runner exits, output still coming is read this long: a child left running with
the code's stdout must not hold the result until the timeout."""
STOPPED_BY_SIGNAL = {137: "SIGKILL (out of memory?)", 139: "SIGSEGV", 134: "SIGABRT"}


@dataclass
class _Run:
    """What one run of the code printed, kept as it streams so a timeout keeps it too."""

    out: OutputCapture
    err: OutputCapture
    sandbox_run: str
    started: float = 0.0
    key: str = field(default_factory=lambda: secrets.token_hex(16))
    """Sent on the runner's stdin; only a line that starts with it is the runner's report."""
    tail: bytearray = field(default_factory=bytearray)

    def detail(self, exit_code: int | None, **extra: Any) -> dict[str, Any]:
        detail: dict[str, Any] = {
            "stdout": _text(self.out.value()),
            "stderr": _text(self.err.value()),
            "exit_code": exit_code,
            "seconds": round(time.monotonic() - self.started, 3) if self.started else None,
            "sandbox_run": self.sandbox_run,
        }
        if self.out.dropped or self.err.dropped:
            detail["truncated"] = {"stdout": self.out.dropped, "stderr": self.err.dropped}
        return {**detail, **extra}

    async def on_output(self, stream: str, data: bytes) -> None:
        if stream == "stderr":
            self.err.add(data)
            return
        self.out.add(data)
        self.tail += data[-REPORT_TAIL_BYTES:]
        del self.tail[:-REPORT_TAIL_BYTES]


async def score_in_sandbox(
    docker: DockerHost,
    image: str,
    scorer: PythonScorer,
    answer: str | None,
    row: Mapping[str, Any],
    *,
    labels: Mapping[str, str] | None = None,
) -> Score:
    """The code's score of `answer` for `row`; ScorerError when it gives none (never a 0).

    `labels`: extra container labels (tests mark theirs `sandhive.test`).
    """
    run = _Run(
        OutputCapture(scorer.output_bytes),
        OutputCapture(scorer.output_bytes),
        secrets.token_hex(8),
    )
    config = _config(image, scorer, {**(labels or {}), **_labels(run.sandbox_run)})
    sandbox = await _create(docker, config, run)
    try:
        result = await _execute(sandbox, scorer, _job(scorer, answer, row, run.key), run)
    finally:
        await _remove(sandbox)
    return _verdict(result, run)


def _labels(sandbox_run: str) -> dict[str, str]:
    created = datetime.now(UTC).replace(microsecond=0).isoformat()
    return {SCORER_LABEL: "python", RUN_LABEL: sandbox_run, CREATED_LABEL: created}


def _config(image: str, scorer: PythonScorer, labels: Mapping[str, str]) -> SandboxConfig:
    return SandboxConfig(
        image=image,
        labels=labels,
        cpus=1.0,
        memory_mb=scorer.memory_mb,
        disk_mb=1,  # the workdir is not used: the code's scratch space is /tmp
        scratch_mb=scorer.scratch_mb,
        pids_limit=scorer.pids_limit,
        network="none",
        read_only_rootfs=True,
        workdir=WORKDIR,
        output_cap_bytes=max(scorer.output_bytes, 2),
        deadline_s=CREATE_TIMEOUT_S + scorer.timeout_s + DEADLINE_MARGIN_S,
    )


def _job(scorer: PythonScorer, answer: str | None, row: Mapping[str, Any], key: str) -> bytes:
    """The runner's stdin. `ground_truth` is an argument of its own, so not also in **row."""
    fields = {k: v for k, v in row.items() if k not in ("ground_truth", "agent_answer")}
    job = {
        "code": scorer.code,
        "answer": answer,
        "ground_truth": row.get("ground_truth"),
        "row": fields,
    }
    return json.dumps({"key": key, "job": job}).encode()


async def _create(docker: DockerHost, config: SandboxConfig, run: _Run) -> DockerSandbox:
    """The scorer's sandbox; SandboxError when Docker cannot make it: the worker's
    infrastructure failing, not the scorer, so the caller tries again or says so."""
    try:
        async with asyncio.timeout(CREATE_TIMEOUT_S):
            return await docker.create_sandbox(config)
    except TimeoutError as exc:
        raise SandboxError(
            f"python scorer: its sandbox was not started within {CREATE_TIMEOUT_S:g} s"
        ) from exc


async def _execute(
    sandbox: DockerSandbox, scorer: PythonScorer, job: bytes, run: _Run
) -> ExecResult:
    """Run the code; past its timeout remove the container, which ends everything it started."""
    run.started = time.monotonic()
    argv = ["python3", "-I", "-c", RUNNER_SOURCE, CODE_SOURCE]
    env = {"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"}
    running = asyncio.create_task(
        sandbox.exec(
            argv, workdir="/tmp", env=env, stdin=job, on_output=run.on_output, linger_s=LINGER_S
        )
    )
    try:
        done, _ = await asyncio.wait({running}, timeout=scorer.timeout_s)
    except asyncio.CancelledError:
        await _remove(sandbox)
        await _settle(running)
        raise
    if not done:
        await _remove(sandbox)
        await _settle(running)
        raise ScorerError(
            f"python scorer: compute_score did not return within {scorer.timeout_s} s",
            run.detail(None, timed_out=True, timeout_s=scorer.timeout_s),
        )
    return running.result()  # a SandboxError (Docker failed running it) is the caller's


async def _settle(running: asyncio.Task[ExecResult]) -> None:
    """Let the exec end (its container is gone), cancelling it if it does not soon."""
    done, _ = await asyncio.wait({running}, timeout=REMOVE_WAIT_S)
    if not done:
        running.cancel()
    with suppress(BaseException):
        await running


async def _remove(sandbox: DockerSandbox) -> None:
    """Remove the container even while being cancelled; its deadline is the backstop."""
    removal = asyncio.ensure_future(sandbox.remove())
    try:
        await asyncio.shield(removal)
    except asyncio.CancelledError:
        with suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(removal), REMOVE_WAIT_S)
        raise
    except SandboxError as exc:
        log.warning("python scorer sandbox %s not removed (its deadline will): %s", sandbox.id, exc)


def _verdict(result: ExecResult, run: _Run) -> Score:
    """The score the runner reported, if it is one; anything else is a ScorerError naming it."""
    report = _report(result.exit_code, run)
    if report is None:
        raise _ended(run, result.exit_code, "its runner ended without a report")
    code, reported = report
    if "raised" in reported:
        raised = reported["raised"] if isinstance(reported["raised"], dict) else {}
        name, message = _text(raised.get("type", "?")), _text(raised.get("message", ""))
        raise ScorerError(
            f"python scorer: compute_score raised {name}: {message}"[:1000], run.detail(code)
        )
    if code != 0:
        raise _ended(run, code, "the code ended without a result")
    if "unreadable" in reported:
        why = _text(reported["unreadable"])[:200]
        raise ScorerError(
            f"python scorer: the code's result could not be read: {why}", run.detail(code)
        )
    if "value" not in reported and "unencodable" not in reported:
        raise _ended(run, code, "the code ended without a result")
    if "unencodable" in reported:
        what = reported["unencodable"] if isinstance(reported["unencodable"], dict) else {}
        raise ScorerError(
            f"python scorer: compute_score returned a {_text(what.get('type', '?'))} "
            f"({_text(what.get('repr', ''))}), not a number in [0, 1]"[:1000],
            run.detail(code),
        )
    value = reported["value"]
    problem = _not_a_score(value)
    if problem:
        raise ScorerError(f"python scorer: compute_score returned {problem}", run.detail(code))
    return Score(value, run.detail(code))


def _ended(run: _Run, exit_code: int, what: str) -> ScorerError:
    why = STOPPED_BY_SIGNAL.get(exit_code, f"exit code {exit_code}")
    return ScorerError(f"python scorer: {what} ({why}); see stderr", run.detail(exit_code))


def _not_a_score(value: object) -> str | None:
    shown = _text(repr(value))[:200]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{shown} (a {type(value).__name__}), not a number in [0, 1]"
    if not 0 <= value <= 1 or not math.isfinite(value):  # a 400-digit int: no float
        return f"{shown}, outside [0, 1]"
    return None


def _report(exit_code: int, run: _Run) -> tuple[int, dict[str, Any]] | None:
    """How the code's process ended and what it sent ({} for nothing), from the runner's
    report; None when there is none: the runner did not exit 0, or stdout's last line is
    not its keyed report.

    Only the last line: the runner writes it once every process of the code's is dead, so
    anything printed after it means the run was not what the runner believed.
    """
    if exit_code != 0:
        return None
    last = bytes(run.tail).rstrip(b"\n").rpartition(b"\n")[2]
    key, _, rest = last.partition(b" ")
    mac, _, body = rest.partition(b" ")
    expected = hmac.new(run.key.encode(), body, hashlib.sha256).hexdigest().encode()
    if not secrets.compare_digest(key, run.key.encode()):
        return None
    if not secrets.compare_digest(mac, expected):  # bytes of the code's landed in the line
        return None
    with suppress(ValueError, RecursionError):
        data = json.loads(body)
        if isinstance(data, dict) and type(data.get("exit_code")) is int:
            result = data.get("result")
            return data["exit_code"], dict(result) if isinstance(result, dict) else {}
    return None


def _text(data: object) -> str:
    """JSON-safe for Postgres: no NUL (jsonb refuses \\u0000), no lone surrogate (what
    `raise ValueError("\\ud800")` reports; not UTF-8, so "?"), bytes decoded leniently."""
    text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
    return text.replace("\x00", "\\x00").encode("utf-8", "replace").decode()
