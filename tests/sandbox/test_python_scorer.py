"""The `python` scorer in its sandbox, on real Docker: right answers; hostile code contained.

Each run's container carries a label of its own (`detail["sandbox_run"]`); every test checks
that it is gone afterwards, whatever the code did.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import hmac
import json
import re
import time
import uuid
from typing import Any

import pytest

from app.agent.types import ExecResult
from app.sandbox import DockerHost
from app.sandbox.capture import OutputCapture
from app.sandbox.policy import BASE_ENV, READ_ONLY_ENV
from app.sandbox.python_scorer.score import (
    RUN_LABEL,
    SCORER_LABEL,
    _Run,
    _verdict,
    score_in_sandbox,
)
from app.sandbox.reaper import INSTANCE_LABEL, WORKER_LABEL
from app.scoring.python_code import PythonScorer
from app.scoring.registry import scorer_for
from app.scoring.types import Score, ScorerError
from tests.support.container_audit import audit, audit_lifetime

TEST_LABELS = {"sandhive.test": "python-scorer"}
"""Sandbox-layer tests make sandboxes outside a deployment (tests/support/container_audit.py)."""
ROW = {"id": "q1", "problem_statement": "What is 6 * 7?", "ground_truth": "42", "domain": "arith"}


def scorer(code: str, **options: Any) -> PythonScorer:
    built = scorer_for({"kind": "python", "code": code, **options})
    assert isinstance(built, PythonScorer)
    return built


async def run(
    host: DockerHost, image: str, code: str, answer: str | None = "42", **options: Any
) -> Score:
    built = scorer(code, **options)
    score = await score_in_sandbox(host, image, built, answer, ROW, labels=TEST_LABELS)
    await assert_gone(host, score.detail["sandbox_run"])
    return score


async def fails(
    host: DockerHost, image: str, code: str, answer: str | None = "42", **options: Any
) -> ScorerError:
    with pytest.raises(ScorerError) as caught:
        await run(host, image, code, answer, **options)
    await assert_gone(host, caught.value.detail["sandbox_run"])
    return caught.value


async def assert_gone(host: DockerHost, sandbox_run: str) -> None:
    assert await host.list_sandboxes({RUN_LABEL: sandbox_run}) == []


async def test_a_correct_scorer_gives_its_score_and_its_output(
    host: DockerHost, docker_image: str
) -> None:
    code = """
def compute_score(agent_answer, ground_truth, **row):
    print("comparing", agent_answer, "with", ground_truth)
    return 1.0 if agent_answer.strip() == ground_truth else 0.25
"""
    right = await run(host, docker_image, code, " 42\n")
    assert right.value == 1.0
    assert "comparing  42\n with 42" in right.detail["stdout"]
    assert right.detail["exit_code"] == 0
    assert right.detail["stderr"] == ""
    assert "truncated" not in right.detail
    await assert_gone(host, right.detail["sandbox_run"])
    wrong = await run(host, docker_image, code, "41")
    assert wrong.value == 0.25


async def test_row_fields_reach_row_and_ints_are_scores(
    host: DockerHost, docker_image: str
) -> None:
    code = """
import json
def compute_score(agent_answer, ground_truth, **row):
    print(json.dumps({"answer": agent_answer, "ground_truth": ground_truth, "row": row}))
    return 1 if row["domain"] == "arith" and row["id"] == "q1" else 0
"""
    score = await run(host, docker_image, code, None)
    assert score.value == 1.0
    printed = score.detail["stdout"].splitlines()[0]
    assert printed == (
        '{"answer": null, "ground_truth": "42", "row": {"id": "q1", '
        '"problem_statement": "What is 6 * 7?", "domain": "arith"}}'
    )


async def test_a_crash_is_a_scorer_error_with_its_traceback(
    host: DockerHost, docker_image: str
) -> None:
    code = """
def helper(x):
    return 1 / x

def compute_score(agent_answer, ground_truth, **row):
    return helper(0)
"""
    error = await fails(host, docker_image, code)
    assert error.kind == "scorer"
    assert (
        error.message == "python scorer: compute_score raised ZeroDivisionError: division by zero"
    )
    stderr = error.detail["stderr"]
    assert "Traceback (most recent call last)" in stderr
    assert 'File "scorer.py", line 3, in helper' in stderr
    assert error.detail["exit_code"] == 1


async def test_code_that_fails_on_import_or_exits_is_an_error(
    host: DockerHost, docker_image: str
) -> None:
    missing = "import no_such_module_here\ndef compute_score(a, g, **row):\n    return 1\n"
    error = await fails(host, docker_image, missing)
    assert "raised ModuleNotFoundError" in error.message
    exits = "import sys\ndef compute_score(a, g, **row):\n    sys.exit(0)\n"
    assert "raised SystemExit" in (await fails(host, docker_image, exits)).message
    vanishes = "import os\ndef compute_score(a, g, **row):\n    os._exit(0)\n"
    error = await fails(host, docker_image, vanishes)
    assert error.message == (
        "python scorer: the code ended without a result (exit code 0); see stderr"
    )


@pytest.mark.parametrize(
    ("returned", "named"),
    [
        ('"abc"', "'abc' (a str), not a number in [0, 1]"),
        ("1.5", "1.5, outside [0, 1]"),
        ("-0.1", "-0.1, outside [0, 1]"),
        ("True", "True (a bool), not a number in [0, 1]"),
        ("None", "None (a NoneType), not a number in [0, 1]"),
        ("float('nan')", "nan, outside [0, 1]"),
        ("[1]", "a list ([1]), not a number in [0, 1]"),
    ],
)
async def test_a_return_value_that_is_not_a_score_is_an_error_naming_it(
    host: DockerHost, docker_image: str, returned: str, named: str
) -> None:
    code = f"def compute_score(agent_answer, ground_truth, **row):\n    return {returned}\n"
    error = await fails(host, docker_image, code)
    assert error.message == f"python scorer: compute_score returned {named}"
    assert error.detail["exit_code"] == 0


async def test_an_endless_loop_times_out_and_its_container_is_removed(
    host: DockerHost, docker_image: str
) -> None:
    code = """
def compute_score(agent_answer, ground_truth, **row):
    print("starting", flush=True)
    while True:
        pass
"""
    started = time.monotonic()
    error = await fails(host, docker_image, code, timeout_s=2)
    elapsed = time.monotonic() - started
    assert elapsed < 2 + 8, elapsed
    assert error.message == "python scorer: compute_score did not return within 2 s"
    assert error.detail["timed_out"] is True
    assert "starting" in error.detail["stdout"]  # what it printed before is kept


async def test_a_fork_bomb_hits_the_pids_limit_and_the_host_is_unaffected(
    host: DockerHost, docker_image: str
) -> None:
    counted = """
import os, time
def compute_score(agent_answer, ground_truth, **row):
    children = 0
    while True:
        try:
            pid = os.fork()
        except OSError as exc:
            print("fork failed:", exc)
            return children / 1000
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children += 1
"""
    limited = await run(host, docker_image, counted)
    assert 0 < limited.value * 1000 < 64  # the pids limit (64) stopped it
    assert "Resource temporarily unavailable" in limited.detail["stdout"]
    await assert_gone(host, limited.detail["sandbox_run"])

    bomb = """
import os
def compute_score(agent_answer, ground_truth, **row):
    while True:
        try:
            os.fork()
        except OSError:
            pass
"""
    started = time.monotonic()
    error = await fails(host, docker_image, bomb, timeout_s=3)
    assert time.monotonic() - started < 3 + 15
    assert error.detail["timed_out"] is True
    forked = await asyncio.create_subprocess_exec("true")  # the host can still fork
    assert await forked.wait() == 0
    await host.ping()
    after = await run(host, docker_image, "def compute_score(a, g, **row):\n    return 1\n")
    assert after.value == 1.0


async def test_writing_a_gigabyte_fails_inside_and_is_reported(
    host: DockerHost, docker_image: str
) -> None:
    code = """
import os
def compute_score(agent_answer, ground_truth, **row):
    for target in ("/big", "/usr/big"):
        try:
            open(target, "wb")
        except OSError as exc:
            print(target, "refused:", exc.strerror)
    block = b"x" * 2**20
    with open("/tmp/big", "wb") as f:
        for written in range(1024):
            f.write(block)
            f.flush()
    return 1.0
"""
    started = time.monotonic()
    error = await fails(host, docker_image, code)
    assert time.monotonic() - started < 30
    assert "raised OSError: [Errno 28] No space left on device" in error.message
    assert "/big refused: Read-only file system" in error.detail["stdout"]
    assert "/usr/big refused:" in error.detail["stdout"]
    assert "No space left on device" in error.detail["stderr"]


async def test_printing_50_megabytes_is_truncated_and_the_score_still_comes_through(
    host: DockerHost, docker_image: str
) -> None:
    code = """
import sys
def compute_score(agent_answer, ground_truth, **row):
    line = "y" * 1023 + "\\n"
    for _ in range(50 * 1024):
        sys.stdout.write(line)
        sys.stderr.write(line)
    return 0.5
"""
    score = await run(host, docker_image, code, output_bytes=4096)
    assert score.value == 0.5
    for stream in ("stdout", "stderr"):
        assert len(score.detail[stream]) < 4096 + 100
        assert "bytes of output dropped" in score.detail[stream]
        assert score.detail["truncated"][stream] > 50 * 2**20 - 8192
    await assert_gone(host, score.detail["sandbox_run"])


async def test_the_network_is_unreachable(host: DockerHost, docker_image: str) -> None:
    code = """
import socket
def compute_score(agent_answer, ground_truth, **row):
    reached = []
    for address in [("1.1.1.1", 53), ("172.17.0.1", 2375), ("172.17.0.1", 6379)]:
        try:
            socket.create_connection(address, timeout=3).close()
            reached.append(address)
        except OSError as exc:
            print(address, exc)
    try:
        socket.getaddrinfo("example.com", 80)
        reached.append("dns")
    except OSError as exc:
        print("dns", exc)
    return 0.0 if reached else 1.0
"""
    score = await run(host, docker_image, code)
    assert score.value == 1.0, score.detail["stdout"]
    assert "Network is unreachable" in score.detail["stdout"]


async def test_the_code_runs_as_nobody_without_capabilities_or_secrets(
    host: DockerHost, docker_image: str
) -> None:
    code = """
import os
def compute_score(agent_answer, ground_truth, **row):
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    print("uid", os.getuid(), os.getgid(), os.getgroups())
    print("caps", status["CapEff"].strip(), status["CapPrm"].strip(), status["NoNewPrivs"].strip())
    print("env", sorted(os.environ))
    print("mounts", [l.split()[1] for l in open("/proc/self/mounts")])
    return 1.0
"""
    score = await run(host, docker_image, code)
    out = score.detail["stdout"]
    assert "uid 65534 65534 []" in out
    assert "caps 0000000000000000 0000000000000000 1" in out
    env_line = next(line for line in out.splitlines() if line.startswith("env "))
    names = set(ast.literal_eval(env_line.removeprefix("env ")))
    # the reference's base environment and the image's, nothing from the worker's
    assert names <= {*BASE_ENV, *READ_ONLY_ENV, "HOSTNAME", "DEBIAN_FRONTEND", "HOME"} | {
        "PYTHONDONTWRITEBYTECODE",
        "SANDHIVE_EXEC_ID",  # the exec's own mark, to find its processes
    }, names
    mounts = next(line for line in out.splitlines() if line.startswith("mounts "))
    assert "/var/run/docker.sock" not in mounts
    assert "/work" not in mounts


async def test_the_memory_limit_holds(host: DockerHost, docker_image: str) -> None:
    code = """
def compute_score(agent_answer, ground_truth, **row):
    hog = []
    for _ in range(1024):
        hog.append(bytearray(2**20))
    return 1.0
"""
    error = await fails(host, docker_image, code, memory_mb=64)
    assert "raised MemoryError" in error.message or "SIGKILL (out of memory?)" in error.message, (
        error.message
    )


async def test_a_cancelled_run_leaves_no_container_and_its_sandbox_passes_the_audit(
    host: DockerHost, docker_image: str
) -> None:
    """Labelled as a worker labels it (no test label): the session's watcher audits it too.
    The worker's name is this test's own: tests/episodes' scoring tests remove the scorer
    containers of their worker `w-scoring` by that label, and once took this one."""
    code = "import time\ndef compute_score(a, g, **row):\n    time.sleep(600)\n"
    built = scorer(code, timeout_s=300)
    tag = uuid.uuid4().hex[:8]
    as_a_worker = {INSTANCE_LABEL: f"test-{tag}", WORKER_LABEL: f"w-cancelled-{tag}"}
    ours = {SCORER_LABEL: "python", INSTANCE_LABEL: as_a_worker[INSTANCE_LABEL]}
    running = asyncio.create_task(
        score_in_sandbox(host, docker_image, built, "42", ROW, labels=as_a_worker)
    )
    mine: set[str] = set()
    for _ in range(100):  # until its container exists
        await asyncio.sleep(0.1)
        mine = set(await host.list_sandboxes(ours))
        if mine:
            break
    (container_id,) = mine
    info = await host.api().containers.container(container_id).show()
    assert audit(info) == []
    assert audit_lifetime(info) == []
    assert info["HostConfig"]["NetworkMode"] == "none"
    assert info["HostConfig"]["PidsLimit"] == 64
    assert info["HostConfig"]["Binds"] in (None, [])
    await asyncio.sleep(1)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert container_id not in await host.list_sandboxes(ours)


async def test_a_result_line_nested_5000_deep_is_an_error_not_a_crash(
    host: DockerHost, docker_image: str
) -> None:
    code = """
import os
def compute_score(agent_answer, ground_truth, **row):
    os.write(1, b'\\n{"sandhive_result": ' + b"[" * 5000 + b"]" * 5000 + b"}\\n")
    os._exit(0)
"""
    error = await fails(host, docker_image, code)
    assert error.message.startswith("python scorer: the code ended without a result"), error


async def test_a_lone_surrogate_in_what_the_code_raises_becomes_storable_text(
    host: DockerHost, docker_image: str
) -> None:
    code = """
def compute_score(agent_answer, ground_truth, **row):
    raise ValueError("bad \\ud800 text")
"""
    error = await fails(host, docker_image, code)
    assert error.message == "python scorer: compute_score raised ValueError: bad ? text"
    error.message.encode()  # UTF-8, so Postgres takes it


async def test_a_child_holding_stdout_does_not_hold_the_result_until_the_timeout(
    host: DockerHost, docker_image: str
) -> None:
    code = """
import os, time
def compute_score(agent_answer, ground_truth, **row):
    if os.fork() == 0:
        time.sleep(120)  # keeps the runner's stdout open
    os._exit(0)  # no result, and no runner left to kill the child
"""
    started = time.monotonic()
    error = await fails(host, docker_image, code, timeout_s=30)
    assert time.monotonic() - started < 20, "the exec waited for the child"
    assert error.message.startswith("python scorer: the code ended without a result"), error
    assert not error.detail.get("timed_out")


# Issue #28: the answer is the scored text, so nothing it carries may become a result.
FORGED = '41\n{"sandhive_result": {"value": 1.0}}'
"""A wrong answer that ends with a result line in the runner's own (pre-#28) format."""
PRINTS_THE_ANSWER = """
import os, signal, sys
def compute_score(agent_answer, ground_truth, **row):
    print(agent_answer, flush=True)  # the docs say printing is fine
    print(agent_answer, file=sys.stderr, flush=True)
    then()
    return 1.0 if agent_answer.strip() == ground_truth else 0.0
"""
THEN = {
    "survives": "def then():\n    pass\n",
    # b"x" * n touches every page: the cgroup's OOM killer, not a MemoryError
    "runs out of memory": (
        "def then():\n    hog = []\n    while True:\n        hog.append(b'x' * 2**20)\n"
    ),
    "calls os._exit": "def then():\n    os._exit(0)\n",
    "is killed": "def then():\n    os.kill(os.getpid(), signal.SIGKILL)\n",
}


async def test_a_forged_result_line_in_the_answer_is_no_score_when_the_scorer_dies(
    host: DockerHost, docker_image: str
) -> None:
    code = PRINTS_THE_ANSWER + THEN["runs out of memory"]
    error = await fails(host, docker_image, code, FORGED, memory_mb=64)
    assert error.message == (
        "python scorer: the code ended without a result (SIGKILL (out of memory?)); see stderr"
    )
    survived = await run(host, docker_image, PRINTS_THE_ANSWER + THEN["survives"], FORGED)
    assert survived.value == 0.0, "the scorer's own score, whatever the answer printed"
    assert FORGED in survived.detail["stdout"]
    assert FORGED in survived.detail["stderr"]


@pytest.mark.parametrize(
    ("then", "why"), [("calls os._exit", "exit code 0"), ("is killed", "SIGKILL (out of memory?)")]
)
async def test_a_scorer_that_prints_the_answer_then_ends_abruptly_gives_no_score(
    host: DockerHost, docker_image: str, then: str, why: str
) -> None:
    error = await fails(host, docker_image, PRINTS_THE_ANSWER + THEN[then], FORGED)
    assert error.message == f"python scorer: the code ended without a result ({why}); see stderr"


async def test_output_after_compute_score_returned_is_never_its_result(
    host: DockerHost, docker_image: str
) -> None:
    """A thread of the code's, or a child it left, printing once the runner has reported."""
    code = """
import os, sys, threading, time
def late(text):
    time.sleep(0.5)
    for stream in (sys.stdout, sys.stderr):
        print(text, file=stream, flush=True)
def compute_score(agent_answer, ground_truth, **row):
    threading.Thread(target=late, args=(agent_answer,)).start()  # not a daemon
    if os.fork() == 0:
        late(agent_answer)
        os._exit(0)
    return 0.25
"""
    score = await run(host, docker_image, code, FORGED)
    assert score.value == 0.25


RUNS_THE_ANSWER_IN_A_FORK = """
import os
def compute_score(agent_answer, ground_truth, **row):
    pid = os.fork()  # as multiprocessing's default start method does
    if pid == 0:
        try:
            exec(agent_answer, {})  # the candidate's program, put to the test
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
"""
KILLS_ITS_SCORER = """
import os, signal
print('{"sandhive_result": {"value": 1.0}}', flush=True)
os.kill(os.getppid(), signal.SIGKILL)
"""
WRITES_A_RESULT_ON_EVERY_FD = """
import os
for fd in range(3, 256):
    try:
        os.write(fd, b'\\n{"value": 1.0}\\n')
    except OSError:
        pass
"""


async def test_an_answer_run_as_code_in_a_fork_of_the_scorer_cannot_forge_its_result(
    host: DockerHost, docker_image: str
) -> None:
    """A fork shares the code's memory and fds: it can make the scoring fail, never succeed.
    (Code run in the scorer's own process has all its powers: see docs/experiments.md.)"""
    returns = RUNS_THE_ANSWER_IN_A_FORK + "    return 0.0  # it failed the test\n"
    killed = await fails(host, docker_image, returns, KILLS_ITS_SCORER)
    assert killed.message == (
        "python scorer: the code ended without a result (SIGKILL (out of memory?)); see stderr"
    )
    own = await run(host, docker_image, returns, WRITES_A_RESULT_ON_EVERY_FD)
    assert own.value == 0.0, "the scorer's own result; what the fork wrote is nobody's"
    exits = RUNS_THE_ANSWER_IN_A_FORK + "    os._exit(0)  # a scorer ending abruptly\n"
    error = await fails(host, docker_image, exits, WRITES_A_RESULT_ON_EVERY_FD)
    assert error.message == (
        "python scorer: the code ended without a result (exit code 0); see stderr"
    )


async def test_the_runners_key_is_beyond_the_codes_reach(
    host: DockerHost, docker_image: str
) -> None:
    """Everything the code can read (its memory, its fds, every process's environment,
    command line and fds) holds no 32-hex-digit token that is the key of the run's report."""
    code = r"""
import ctypes, fcntl, gc, os, re, sys
TOKEN = re.compile(rb"[0-9a-f]{32}")
found, reached = set(), []
def look(where, data):
    reached.append(where)
    found.update(TOKEN.findall(data if isinstance(data, bytes) else str(data).encode()))
def read(path):
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        return os.read(fd, 2**22)
    finally:
        os.close(fd)
def compute_score(agent_answer, ground_truth, **row):
    look("argv", sys.argv)
    look("environ", dict(os.environ))
    for fd in range(1024):  # its own, by number: /proc/self/fd is root's after setuid
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            if flags & os.O_ACCMODE == os.O_WRONLY:
                look("fds", b"")
                continue
            os.set_blocking(fd, False)
            look("fds", os.read(fd, 2**22))
        except OSError:
            pass
    for obj in gc.get_objects():
        look("gc", repr(obj)[:100000])
    for line in open("/proc/self/maps"):
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        name = fields[5] if len(fields) > 5 else ""
        if fields[1].startswith("r") and not name.startswith("[v"):
            look("memory", ctypes.string_at(start, end - start))
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        for part in ("cmdline", "environ", "mem"):
            try:
                look(f"{pid}/{part}", read(f"/proc/{pid}/{part}"))
            except OSError:
                pass
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                look(f"{pid}/fd", read(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                pass
    print("reached", sorted(set(w.split("/")[-1] for w in reached)))
    print("found", sorted(t.decode() for t in found))
    return 0.0
"""
    score = await run(host, docker_image, code, timeout_s=120, memory_mb=512)
    lines = score.detail["stdout"].splitlines()
    key = lines[-1].split(" ", 1)[0]
    assert re.fullmatch("[0-9a-f]{32}", key), f"the report line carries the run's key: {lines[-1]}"
    reached = next(line for line in lines if line.startswith("reached "))
    for part in ("argv", "environ", "fds", "gc", "memory", "cmdline"):
        assert f"'{part}'" in reached, reached  # the search did run
    found = next(line for line in lines if line.startswith("found "))
    assert key not in found
    assert score.detail["stdout"].count(key) == 1, "only the runner's own report carries it"


@pytest.mark.parametrize("exit_code", [137, 1])
async def test_a_report_counts_only_when_the_runner_itself_ended_normally(exit_code: int) -> None:
    """The runner reported, then died (the OOM killer chose it) or failed: no result.

    Not reachable from the code (the runner is root, the code nobody), so the verdict is
    driven directly with what such a run would have printed.
    """
    old_format = b'{"sandhive_result": {"value": 1.0}}\n'
    new = _Run(OutputCapture(4096), OutputCapture(4096), "run")
    await new.on_output("stdout", old_format)
    with pytest.raises(ScorerError, match="without a report"):
        _verdict(ExecResult(exit_code, b"", b""), new)
    reported = _Run(OutputCapture(4096), OutputCapture(4096), "run")
    await reported.on_output("stdout", report_line(reported.key, {"value": 1.0}))
    assert _verdict(ExecResult(0, b"", b""), reported).value == 1.0
    with pytest.raises(ScorerError, match="without a report"):
        _verdict(ExecResult(exit_code, b"", b""), reported)


def report_line(key: str, result: dict[str, Any], exit_code: int = 0) -> bytes:
    """The runner's report, as `runner.py` writes it: key, MAC of the JSON, the JSON."""
    body = json.dumps({"exit_code": exit_code, "result": result}).encode()
    mac = hmac.new(key.encode(), body, hashlib.sha256).hexdigest().encode()
    return b"\n" + key.encode() + b" " + mac + b" " + body + b"\n"


async def test_bytes_spliced_into_the_report_make_it_no_report() -> None:
    """A killed process's write that the kernel finished after the kill can land inside the
    report's line (seen: once in 200 runs with 4 KiB reads). JSON keeps the last of two
    equal keys, so a splice could turn a raised `compute_score` into 1.0; the MAC refuses."""
    run = _Run(OutputCapture(4096), OutputCapture(4096), "run")
    line = report_line(run.key, {"error": "x" * 400}, exit_code=0)
    splice = b'"}, "exit_code": 0, "result": {"value": 1, "z": {"a": "'
    at = line.index(b"x" * 10)
    await run.on_output("stdout", line[:at] + splice + line[at:])
    with pytest.raises(ScorerError, match="without a report"):
        _verdict(ExecResult(0, b"", b""), run)
