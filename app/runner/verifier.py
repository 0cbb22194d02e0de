"""A task's verifier, run as Harbor runs a task's `tests/test.sh`: in the sandbox the agent
left, after it ended, its reward read from the file the script writes.

Harbor's conventions, so its task folders run unchanged: the files land under /tests
(copied only now: the agent never saw them), the command runs as root from /tests, and
the reward is /logs/verifier/reward.json (numbers by name) if present, else reward.txt
(one number). Stale reward files, and
anything the agent left in /tests or /logs/verifier, are removed before the files go in.

What it can and cannot vouch for: the script judges the state the agent left, and the
agent was root in that sandbox. Before the script runs, every process of the sandbox is
killed (none is left to write a reward meanwhile), /tests and /logs/verifier are emptied
(a planted file or link removed, never followed), and the script runs by `docker exec` as
root with a fixed PATH and HOME and no Python user site. On an image whose own files are
writable (`read_only_rootfs: false`) the agent could still have replaced the programs the
script calls; Harbor's verifier trusts the environment the same way.
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
ROOT = "0"
STOP_EVERYTHING = """
import os, signal, sys, time

def parents():
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                state, parent = open("/proc/%s/stat" % name).read().rsplit(")", 1)[1].split()[:2]
            except (OSError, IndexError, ValueError):
                continue
            if state != "Z":  # a zombie is dead already: its parent (init) reaps it
                found[int(name)] = int(parent)
    return found

main = min((pid for pid, parent in parents().items() if parent == 1), default=None)
for _ in range(100):  # again until a pass finds none: a child forked meanwhile goes too
    left = [pid for pid in parents() if pid not in (1, main, os.getpid())]
    if not left:
        sys.exit(0)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.01)
print("still running: %s" % left, file=sys.stderr)
sys.exit(1)
"""
"""Run by `docker exec` as root: SIGKILL to every process of the sandbox but its init, the
main command (init's oldest child, whose end would end the container) and itself, pass
after pass until none is left (exit 1 if they keep coming)."""
PREPARE = (
    f"rm -rf {VERIFIER_DIR} && find {TESTS_DIR} -mindepth 1 -delete"
    f" && mkdir -p {VERIFIER_DIR} /logs/agent"
    f" && tar -x --no-same-owner -f - -C {TESTS_DIR}"
    f" && find {TESTS_DIR} -name '*.sh' -exec chmod +x {{}} +"
)
"""A link planted where the reward goes is removed itself (`rm -rf`), never followed."""
READ_REWARD = (
    f"cd {VERIFIER_DIR} || exit 3; for f in reward.json reward.txt; do"
    ' if [ -h "$f" ]; then echo "link $f"; exit 0; fi;'
    ' if [ -f "$f" ]; then'
    '   if [ -s "$f" ]; then echo "${f#reward.}"; head -c 65536 "$f"; else echo empty; fi;'
    "   exit 0;"
    " fi; done; echo none"
)
CLEAN_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": f"{TESTS_DIR}/.home",
    "PYTHONNOUSERSITE": "1",
}
"""The command's environment over the sandbox's: nothing the agent left in /root (a
Python user site, a shell profile) or on its PATH reaches it."""
STEP_TIMEOUT_S = 60.0


class Execs(Protocol):
    """What the verifier needs of a sandbox (`DockerSandbox`)."""

    async def exec(
        self,
        argv: list[str],
        *,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        user: str | None = None,
        direct: bool = False,
    ) -> Any: ...


@dataclass(frozen=True)
class Found:
    """A reward, or why there is none."""

    reward: float | None
    rewards: dict[str, float]
    error: str | None = None


async def verify(
    box: Execs, spec: VerifierSpec, *, output_bytes: int, after_agent: bool = True
) -> dict[str, Any]:
    """Run the verifier in `box`; `VerificationOut`'s JSON. Raises SandboxError (Docker
    failed: the caller records an infrastructure failure), never for the script's own.

    Every step runs by `docker exec` as root with `CLEAN_ENV`, past the exec channel and
    whatever user the image names. `after_agent`: the agent's processes are killed first,
    and what the script's run started before the reward is read."""
    steps = _Steps(box, after_agent)
    started = time.monotonic()
    if (why := await steps.stop_everything()) is not None:
        return _result(started, error=why)
    files = [(path, base64.b64decode(content)) for path, content in spec.files]
    prepared = await steps.run(["sh", "-c", PREPARE], stdin=build_tar(files))
    if prepared.timed_out:
        return unavailable("putting the verifier's files in /tests timed out")
    if prepared.exit_code != 0:
        detail = prepared.stderr.decode(errors="replace")[-2000:]
        return _result(started, error=f"the verifier's files could not be put in /tests: {detail}")
    ran = await steps.run(["bash", "-c", spec.command], workdir=TESTS_DIR, timeout_s=spec.timeout_s)
    out = {
        "exit_code": ran.exit_code,
        "stdout": _tail(ran.stdout, output_bytes),
        "stderr": _tail(ran.stderr, output_bytes),
    }
    if ran.timed_out:
        return _result(started, error=f"the verifier ran past {spec.timeout_s} s", **out)
    if (why := await steps.stop_everything()) is not None:
        return _result(started, error=why, **out)
    read = await steps.run(["sh", "-c", READ_REWARD])
    if read.timed_out or read.exit_code != 0:  # its directory gone: no reward, the agent's
        return _result(started, error="the reward could not be read", **out)
    found = parse_reward(read.stdout.decode(errors="replace"))
    return _result(started, reward=found.reward, rewards=found.rewards, error=found.error, **out)


class _Steps:
    """The verifier's commands in one sandbox: `docker exec` as root, a clean environment."""

    def __init__(self, box: Execs, after_agent: bool) -> None:
        self.box, self.after_agent = box, after_agent

    async def run(self, argv: list[str], **options: Any) -> Any:
        options = {"workdir": "/", "timeout_s": STEP_TIMEOUT_S, **options}
        return await self.box.exec(argv, env=CLEAN_ENV, user=ROOT, direct=True, **options)

    async def stop_everything(self) -> str | None:
        """Why the agent's processes could not all be stopped (its doing), or None."""
        if not self.after_agent:
            return None
        stopped = await self.run(["python3", "-c", STOP_EVERYTHING])
        if stopped.timed_out or stopped.exit_code != 0:
            why = stopped.stderr.decode(errors="replace")[-500:]
            return f"the agent's processes could not be stopped: {why}"
        return None


def parse_reward(report: str) -> Found:
    """The reward from READ_REWARD's report, read as Harbor reads it: a reward.json of
    finite numbers by name, else a reward.txt of one number. The item's reward is the
    json's `reward`, or its only value."""
    kind, _, body = report.partition("\n")
    if kind == "none":
        return Found(None, {}, f"no reward file: {VERIFIER_DIR}/reward.txt or reward.json")
    if kind.startswith("link "):
        return Found(None, {}, f"the reward file {kind[5:]} is a symbolic link: not read")
    if kind == "empty":
        return Found(None, {}, "the reward file is empty")
    if kind == "txt":
        return _from_text(body)
    return _from_json(body)


def _from_text(body: str) -> Found:
    try:
        value = float(body)
    except (ValueError, OverflowError):
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
    rewards: dict[str, float] = {}
    for name, value in loaded.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            return Found(None, {}, f"reward.json's {name!r} is not a number: {str(value)[:80]}")
        try:
            rewards[str(name)] = float(value)
        except OverflowError:
            return Found(None, {}, f"reward.json's {name!r} is too large: {str(value)[:80]}")
        if not math.isfinite(rewards[str(name)]):
            return Found(None, {}, f"reward.json's {name!r} is not finite: {value}")
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
