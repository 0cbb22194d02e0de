"""Runs inside a `python` scorer's sandbox as root, never in Sandhive's own processes: the
one process whose report `app.sandbox.python_scorer.score` believes.

The host passes this file's source to `python3 -I -c`, the code process's source
(`code`) as its one argument, and on stdin `{"key": ..., "job": ...}`. The key
is a per-run secret, read here before any user code exists and never handed on. This
process starts the code's (exec'd: a fresh address space, without the key, that drops to
`nobody` before the code is compiled) with the job on its stdin and one end of a datagram
socket pair for its result. It waits for it to end, reads the messages on its own end,
SIGKILLs every process of `nobody`'s (nothing the code started can print any more), and
only then writes its report as the last line of stdout:
`<key> <mac> {"exit_code": <how the code's process ended>, "result": <what it sent, or null>}`,
`<mac>` being the HMAC-SHA256 of the JSON under the key. A write the kernel was already
carrying out for a killed process can still land in the pipe after the kill, even inside
the report's line: the MAC makes such a line no report rather than a different one.

Who may speak: the code shares stdout with us but can neither read the key (another uid's
memory) nor write after the report, so no line it prints passes for one. The result is the
one message whose sender the kernel names (SCM_CREDENTIALS) as the code's process itself:
a fork of it (a program under test, as multiprocessing runs one) holds the same socket but
not the same pid, and the exited process is not reaped until its messages are read, so no
new process can take its pid meanwhile. This process exits 0 once it has reported; any
other status (the OOM killer chose it, a failure here) means there is no report. Standard
library only: the sandbox image's python3 runs it.
"""

import contextlib
import hashlib
import hmac
import json
import os
import signal
import socket
import struct
import subprocess
import sys
from typing import IO

NOBODY = 65534
RESULT_MAX = 16384
"""The code's process sends at most a few KiB (500 escaped characters of a message); more is
no result."""
UCRED = struct.Struct("iII")
"""struct ucred: pid, uid, gid."""


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    """The job, then EOF; a code process that died first refused it, and that is its end."""
    assert pipe is not None
    with contextlib.suppress(OSError):
        pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


def _ended(pid: int) -> int:
    """Its exit status (128 + signal when killed), once it ended; not reaped (WNOWAIT)."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    assert info is not None  # None only with WNOHANG
    return info.si_status if info.si_code == os.CLD_EXITED else 128 + info.si_status


def _stop_nobody() -> None:
    """SIGKILL every process of nobody's: after this, nothing the code started can print.

    As root, kill(-1) would reach the container's own processes; with the real and
    effective uid nobody's it reaches exactly what the code started, never the caller (nor
    root's processes: the saved uid, kept 0 to come back, gives no right to signal them).
    No fork: the code's leftovers may hold every pid there is.
    """
    os.setresuid(NOBODY, NOBODY, 0)
    try:
        for _ in range(2):  # a fork under way during the first is caught by the second
            with contextlib.suppress(ProcessLookupError):  # none left
                os.kill(-1, signal.SIGKILL)
    finally:
        os.setresuid(0, 0, 0)


def _messages(ours: socket.socket, pid: int) -> list[bytes]:
    """The messages waiting on our end that the code's process itself sent, in order."""
    ours.setblocking(False)
    sent: list[bytes] = []
    while True:
        try:
            data, ancillary, flags, _ = ours.recvmsg(RESULT_MAX + 1, socket.CMSG_SPACE(UCRED.size))
        except BlockingIOError:
            return sent
        for level, kind, cred in ancillary:
            if (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS):
                if UCRED.unpack(cred[: UCRED.size])[0] == pid:
                    sent.append(data if not flags & socket.MSG_TRUNC else b"")


def _result(sent: list[bytes]) -> object:
    """What the code's process sent (None: nothing), if it is one JSON object."""
    if not sent:
        return None
    if len(sent) > 1:
        return {"unreadable": "the code's process sent more than one result"}
    try:
        result = json.loads(sent[0])
    except (ValueError, RecursionError):
        return {"unreadable": "not JSON (or longer than it may be)"}
    return result if isinstance(result, dict) else {"unreadable": "not a JSON object"}


def _write(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def main() -> int:
    given = json.loads(sys.stdin.buffer.read())
    key = str(given["key"]).encode()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # before anything is sent
    code = subprocess.Popen(
        [sys.executable, "-I", "-c", sys.argv[1], str(theirs.fileno())],
        stdin=subprocess.PIPE,
        pass_fds=(theirs.fileno(),),
        cwd="/tmp",
    )
    theirs.close()
    _feed(code.stdin, json.dumps(given["job"]).encode())
    status = _ended(code.pid)
    result = _result(_messages(ours, code.pid))
    code.wait()  # reaped only now: until then no other process could be given its pid
    _stop_nobody()
    report = {"exit_code": status, "result": result}
    try:
        line = json.dumps(report)
    except (ValueError, RecursionError):
        line = json.dumps({**report, "result": {"unreadable": "not encodable"}})
    body = line.encode()
    mac = hmac.new(key, body, hashlib.sha256).hexdigest().encode()
    _write(b"\n" + key + b" " + mac + b" " + body + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
