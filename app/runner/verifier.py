"""A task's verifier, run as Harbor runs a task's `tests/test.sh`: in the sandbox the agent
left, after it ended, its reward read from the file the script writes.

Harbor's conventions, so its task folders run unchanged: the files land under /tests
(copied only now: the agent never saw them), the command runs as root from /tests, and
the reward is /logs/verifier/reward.json (numbers by name) if present, else reward.txt
(one number). Stale reward files, and
anything the agent left in /tests or /logs/verifier, are removed before the files go in.

What it can and cannot vouch for: the script judges the state the agent left, and the
agent was root in that sandbox. It could have replaced the tools the script calls
(`python3`, `pytest`) or left a process running that writes a reward file while the script
runs; Harbor's verifier trusts the environment the same way. A reward file written
before the verifier starts is always removed.
"""

from __future__ import annotations

import base64
import json
import math
import time
from dataclasses import dataclass
from typing import Any, Protocol

from app.sandbox.files import build_tar
from app.specs import VerifierSpec

TESTS_DIR = "/tests"
VERIFIER_DIR = "/logs/verifier"
SCRATCH = (TESTS_DIR, "/logs")
"""The directories a verified task's sandbox gets writable (tmpfs), whatever its rootfs."""
PREPARE = (
    f"find {TESTS_DIR} {VERIFIER_DIR} -mindepth 1 -delete 2>/dev/null;"
    f" mkdir -p {TESTS_DIR} {VERIFIER_DIR} /logs/agent"
    f" && tar -x --no-same-owner -f - -C {TESTS_DIR}"
    f" && find {TESTS_DIR} -name '*.sh' -exec chmod +x {{}} +"
)
READ_REWARD = (
    f"if [ -s {VERIFIER_DIR}/reward.json ]; then echo json; cat {VERIFIER_DIR}/reward.json;"
    f" elif [ -e {VERIFIER_DIR}/reward.json ]; then echo empty;"
    f" elif [ -s {VERIFIER_DIR}/reward.txt ]; then echo txt; cat {VERIFIER_DIR}/reward.txt;"
    f" elif [ -e {VERIFIER_DIR}/reward.txt ]; then echo empty; else echo none; fi"
)
REWARD_MAX_BYTES = 64 * 1024


class Execs(Protocol):
    """What the verifier needs of a sandbox (`DockerSandbox`)."""

    async def exec(
        self,
        argv: list[str],
        *,
        workdir: str | None = None,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
    ) -> Any: ...


@dataclass(frozen=True)
class Found:
    """A reward, or why there is none."""

    reward: float | None
    rewards: dict[str, float]
    error: str | None = None


async def verify(box: Execs, spec: VerifierSpec, *, output_bytes: int) -> dict[str, Any]:
    """Run the verifier in `box`; `VerificationOut`'s JSON. Raises SandboxError (Docker
    failed: the caller records an infrastructure failure), never for the script's own."""
    started = time.monotonic()
    files = [(path, base64.b64decode(content)) for path, content in spec.files]
    prepared = await box.exec(
        ["sh", "-c", PREPARE], workdir="/", stdin=build_tar(files), timeout_s=120
    )
    if prepared.exit_code != 0:
        detail = prepared.stderr.decode(errors="replace")[-2000:]
        return _result(started, error=f"the verifier's files could not be put in /tests: {detail}")
    ran = await box.exec(["bash", "-c", spec.command], workdir=TESTS_DIR, timeout_s=spec.timeout_s)
    out = {
        "exit_code": ran.exit_code,
        "stdout": _tail(ran.stdout, output_bytes),
        "stderr": _tail(ran.stderr, output_bytes),
    }
    if ran.timed_out:
        return _result(started, error=f"the verifier ran past {spec.timeout_s} s", **out)
    read = await box.exec(["sh", "-c", READ_REWARD], workdir="/", timeout_s=60)
    found = parse_reward(read.stdout[:REWARD_MAX_BYTES].decode(errors="replace"))
    return _result(started, reward=found.reward, rewards=found.rewards, error=found.error, **out)


def parse_reward(report: str) -> Found:
    """The reward from READ_REWARD's report, read as Harbor reads it: a reward.json of
    finite numbers by name, else a reward.txt of one number. The item's reward is the
    json's `reward`, or its only value."""
    kind, _, body = report.partition("\n")
    if kind == "none":
        return Found(None, {}, f"no reward file: {VERIFIER_DIR}/reward.txt or reward.json")
    if kind == "empty":
        return Found(None, {}, "the reward file is empty")
    if kind == "txt":
        return _from_text(body)
    return _from_json(body)


def _from_text(body: str) -> Found:
    try:
        value = float(body)
    except ValueError:
        return Found(None, {}, f"reward.txt is not a number: {body.strip()[:200]!r}")
    if not math.isfinite(value):
        return Found(None, {}, f"reward.txt is not finite: {value}")
    return Found(value, {"reward": value})


def _from_json(body: str) -> Found:
    try:
        loaded = json.loads(body)
    except ValueError:
        return Found(None, {}, f"reward.json is not JSON: {body.strip()[:200]!r}")
    if not isinstance(loaded, dict) or not loaded:
        return Found(None, {}, "reward.json must be an object of rewards by name")
    for name, value in loaded.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            return Found(None, {}, f"reward.json's {name!r} is not a number: {value!r:.80}")
        if not math.isfinite(value):
            return Found(None, {}, f"reward.json's {name!r} is not finite: {value}")
    rewards = {str(name): float(value) for name, value in loaded.items()}
    if "reward" in rewards:
        return Found(rewards["reward"], rewards)
    if len(rewards) == 1:
        return Found(next(iter(rewards.values())), rewards)
    return Found(None, rewards, "reward.json has several rewards and none named 'reward'")


def unavailable(message: str) -> dict[str, Any]:
    """The verification of a task whose verifier the service could not run."""
    return {"reward": None, "rewards": {}, "error": message, "infrastructure": True}


def _result(started: float, **found: Any) -> dict[str, Any]:
    return {
        "reward": None,
        "rewards": {},
        **found,
        "infrastructure": False,
        "seconds": round(time.monotonic() - started, 3),
    }


def _tail(data: bytes, limit: int) -> str:
    text = data[-limit:].decode("utf-8", errors="replace")
    return text if len(data) <= limit else f"[... {len(data) - limit} bytes dropped ...]" + text
