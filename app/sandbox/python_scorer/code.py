"""Runs a `python` scorer's `compute_score`, as `nobody`, in a process of its own.

Started by `runner` (root, in the scorer's sandbox, never in Sandhive's own
processes) as `python3 -I -c <this source> <fd>`: a fresh interpreter, so none of the
runner's memory (its per-run key) is in this address space. It gives up root before it
reads anything, reads the job (`code`, `answer`, `ground_truth`, `row`) on stdin, calls
`compute_score(answer, ground_truth, **row)`, sends what came back as one datagram on
`fd` (the runner's socket, which learns from the kernel that this process sent it, so a
fork writing there is ignored) and ends at once (`os._exit`: a thread the code started dies
with it). Its stdout and stderr are the run's: what the code prints is shown, never read as
a result. Whether the value is a valid score is decided outside, where the code cannot
reach. Standard library only: the sandbox image's python3 runs it.
"""

import contextlib
import json
import os
import socket
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

NOBODY = 65534


def _give_up_root() -> None:
    """First in line for the OOM killer (so the runner outlives an allocation), then nobody."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as adj:
        adj.write("1000")  # raising it needs no privilege; root still owns the file here
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)  # from here on no capability is left, and no-new-privileges holds
    os.chdir("/tmp")
    os.environ["HOME"] = "/tmp"


def _send(fd: int, result: dict[str, object], status: int) -> NoReturn:
    """Flush what the code printed, send the result on fd, end with `status`."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    try:
        data = json.dumps(result).encode()
    except (ValueError, RecursionError):  # an int of more digits than str() allows
        data = json.dumps({"unencodable": {"type": "int", "repr": "(too long to show)"}}).encode()
    try:  # never waits: a fork that filled the runner's queue only costs the result
        socket.socket(fileno=fd).send(data, socket.MSG_DONTWAIT)
    except OSError:  # that, or the code closed or replaced the socket
        os._exit(3)
    os._exit(status)


def _encoded(value: object) -> dict[str, object]:
    if isinstance(value, str):
        return {"value": value[:200]}  # never a score: only shown in the error
    if value is None or isinstance(value, bool | int | float):
        return {"value": value}
    shown = _shown(repr, value, 200)
    return {"unencodable": {"type": type(value).__name__[:200], "repr": shown}}


def _shown(show: Callable[[object], str], thing: object, limit: int) -> str:
    try:
        return str(show(thing))[:limit]
    except Exception:  # a hostile __str__ or __repr__
        return "(unprintable)"


def main() -> None:
    fd = int(sys.argv[1])
    os.set_inheritable(fd, False)  # a program the code starts does not get the result socket
    _give_up_root()
    job = json.loads(sys.stdin.buffer.read())
    namespace: dict[str, object] = {"__name__": "scorer", "__file__": "scorer.py"}
    try:
        exec(compile(job["code"], "scorer.py", "exec"), namespace)
        compute_score = namespace["compute_score"]
        if not callable(compute_score):
            raise TypeError("compute_score is not a function")
        value = compute_score(job["answer"], job["ground_truth"], **job["row"])
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are failures here too
        traceback.print_exc()
        raised = {"type": type(exc).__name__[:200], "message": _shown(str, exc, 500)}
        _send(fd, {"raised": raised}, 1)
    _send(fd, _encoded(value), 0)


if __name__ == "__main__":
    main()
