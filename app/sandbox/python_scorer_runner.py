"""Runs inside a `python` scorer's sandbox, never in Sandhive's own processes.

`app.sandbox.python_scorer` passes this file's source to `python3 -I -c` and the job as JSON
on stdin (`code`, `answer`, `ground_truth`, `row`). It drops root before the user's code is
even compiled, calls `compute_score(answer, ground_truth, **row)` and prints what came back
as the last line of stdout, `{"sandhive_result": ...}`; a traceback goes to stderr. It only
reports: whether the value is a valid score is decided outside, where the code cannot reach.
Standard library only: the sandbox image's python3 runs it.
"""

import contextlib
import json
import os
import signal
import sys
import traceback

NOBODY = 65534
RESULT_KEY = "sandhive_result"


def _report(result: dict[str, object]) -> None:
    """Print the result once nothing the code started is left to hold stdout open.

    As `nobody`, kill(-1) reaches exactly the code's own processes (never this one, nor
    the container's root ones): a child left running would keep the exec going until the
    timeout.
    """
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    with contextlib.suppress(OSError):
        os.kill(-1, signal.SIGKILL)
    os.write(1, b"\n" + json.dumps({RESULT_KEY: result}).encode() + b"\n")


def _encoded(value: object) -> dict[str, object]:
    if isinstance(value, str):
        return {"value": value[:200]}  # never a score: only shown in the error
    if value is None or isinstance(value, bool | int | float):
        return {"value": value}
    return {"unencodable": {"type": type(value).__name__, "repr": repr(value)[:200]}}


def _text(exc: BaseException) -> str:
    try:
        return str(exc)[:500]
    except Exception:  # a hostile __str__
        return "(unprintable)"


def main() -> int:
    job = json.loads(sys.stdin.buffer.read())
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)  # from here on no capability is left, and no-new-privileges holds
    os.chdir("/tmp")
    os.environ["HOME"] = "/tmp"
    namespace: dict[str, object] = {"__name__": "scorer", "__file__": "scorer.py"}
    try:
        exec(compile(job["code"], "scorer.py", "exec"), namespace)
        compute_score = namespace["compute_score"]
        if not callable(compute_score):
            raise TypeError("compute_score is not a function")
        value = compute_score(job["answer"], job["ground_truth"], **job["row"])
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are failures here too
        traceback.print_exc()
        _report({"raised": {"type": type(exc).__name__, "message": _text(exc)}})
        return 1
    _report(_encoded(value))
    return 0


if __name__ == "__main__":
    sys.exit(main())
