"""Start `python -m app ...` processes by forking one that has already imported the app.

A fresh `python -m app serve` or `worker` spends about 1.5 CPU-seconds importing
FastAPI, SQLAlchemy, pydantic and building the app's models before it runs a line of
its own; the suite starts a few hundred of them, and on a 2-core CI machine those
imports alone were minutes of the wall time. A zygote (the Android name) pays for the
imports once per pytest worker: it imports what `serve`, `worker` and the CLI import,
then forks a child per request. The child is the real command: it takes the caller's
argv, environment, working directory and stdio file descriptors, runs
`app/__main__.py` as `__main__` the way `python -m app` does, and exits with the
command's status. Only the interpreter's start and the imports are shared.

The zygote holds no thread and no event loop when it forks (both would be unsafe to
fork), and nothing in `app` reads the environment or its pid at import time
(tests/support/test_zygote.py checks that a child sees its own).

`AppProcess` is what a test holds: the child's real pid (signals go straight to it),
and `poll`/`wait`/`returncode` from the zygote, which reaps the child and writes its
wait status back on the request's socket.

Tests that exercise the command's own start-up (the console script, the compose
stack, an upgrade from an old checkout) still exec a fresh interpreter.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

PRELOAD = ("app.cli.main", "app.api.app", "app.api.server", "app.worker.pool", "app.worker.health")
"""What `serve`, `worker` and the CLI's commands import after their start."""
MAX_REQUEST = 1 << 20
START_TIMEOUT_S = 60.0
PARENT_CHECK_S = 5.0
APP_MAIN = str(Path(__file__).resolve().parents[2] / "app" / "__main__.py")


# ---- the zygote's side -------------------------------------------------------------------


def serve(path: str) -> None:
    """Import the app, then fork a child per request on the unix socket at `path`."""
    for name in PRELOAD:
        __import__(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, its request's socket)
    parent = os.getppid()
    while os.getppid() == parent:  # a test process killed outright leaves no zygote behind
        for key, _ in selector.select(timeout=PARENT_CHECK_S):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                started = _start(conn, listener, selector, children)
                if started is not None:
                    pidfd, pid = started
                    selector.register(pidfd, selectors.EVENT_READ)
                    children[pidfd] = (pid, conn)
                continue
            pidfd = int(key.fd)
            pid, conn = children.pop(pidfd)
            selector.unregister(pidfd)
            _, status = os.waitpid(pid, 0)
            os.close(pidfd)
            try:
                conn.send(json.dumps({"status": status}).encode())
            except OSError:
                pass  # the test process is gone: nobody waits for this status
            conn.close()


def _start(
    conn: socket.socket,
    listener: socket.socket,
    selector: selectors.BaseSelector,
    children: Mapping[int, tuple[int, socket.socket]],
) -> tuple[int, int] | None:
    """Read one request (a JSON line and three fds) and fork its child: (pidfd, pid)."""
    try:
        message, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
        request = json.loads(message)
    except (OSError, ValueError):
        conn.close()
        return None
    pid = os.fork()
    if pid == 0:  # the child: never returns
        listener.close()
        for pidfd, (_, other) in children.items():
            os.close(pidfd)
            other.close()
        selector.close()
        conn.close()
        _run_child(request, fds)
    for fd in fds:
        os.close(fd)
    conn.send(json.dumps({"pid": pid}).encode())
    return os.pidfd_open(pid), pid


def _run_child(request: dict[str, Any], fds: list[int]) -> None:
    """Become `python -m app ARGS`: stdio, cwd, environment, session, then the command."""
    code: int | str | None = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        if request["new_session"]:
            os.setsid()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # sys.stdin/stdout/stderr wrap fds 0-2, now the caller's; their buffers are empty.
        sys.argv = [APP_MAIN, *request["args"]]
        sys.path[0] = request["cwd"]  # as `python -m` puts its working directory first
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            runpy.run_module("app", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exit_:
            code = exit_.code
        except BaseException:
            traceback.print_exc()
            code = 1
        threading._shutdown()  # type: ignore[attr-defined]  # as the interpreter does at exit
        atexit._run_exitfuncs()
    finally:
        status = _exit_status(code)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)


def _exit_status(code: int | str | None) -> int:
    """What the interpreter makes of `sys.exit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


# ---- the test's side ---------------------------------------------------------------------


class Zygote:
    """One zygote per test process, started at first use and stopped at exit."""

    _lock = threading.Lock()
    _instance: Zygote | None = None

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="sandhive-zygote-")
        self.path = os.path.join(self.dir, "socket")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.zygote", self.path],
            cwd=Path(APP_MAIN).parents[1],
            stdout=subprocess.PIPE,
            env={k: v for k, v in os.environ.items() if not k.startswith("SANDHIVE_")},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line != b"ready\n":
            raise RuntimeError(f"the zygote did not start (said {line!r}); see its stderr above")

    @classmethod
    def get(cls) -> Zygote:
        with cls._lock:
            if cls._instance is None or cls._instance.proc.poll() is not None:
                cls._instance = Zygote()
                atexit.register(cls._instance.stop)
            return cls._instance

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


class AppProcess:
    """A `python -m app ARGS` child of the zygote, with the parts of `Popen` tests use."""

    def __init__(
        self,
        args: Sequence[str],
        env: Mapping[str, str],
        cwd: str | Path | None = None,
        stdin: IO[Any] | int | None = None,
        stdout: IO[Any] | int | None = None,
        stderr: IO[Any] | int | None = None,
        start_new_session: bool = False,
    ) -> None:
        self.args = [sys.executable, "-m", "app", *args]
        self.returncode: int | None = None
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        fds, mine = self._stdio(stdin, stdout, stderr)
        request = {
            "args": list(args),
            "env": dict(env),
            "cwd": str(cwd or os.getcwd()),
            "new_session": start_new_session,
        }
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._sock.settimeout(START_TIMEOUT_S)
            self._sock.connect(Zygote.get().path)
            socket.send_fds(self._sock, [json.dumps(request).encode()], fds)
            self.pid = int(self._receive()["pid"])
        finally:
            for fd in mine:
                os.close(fd)
        self._wait_lock = threading.Lock()

    def _stdio(self, *streams: IO[Any] | int | None) -> tuple[list[int], list[int]]:
        """The three fds to hand the child, and those of them to close here once handed."""
        fds: list[int] = []
        close: list[int] = []
        for target, stream in enumerate(streams):
            if stream is None:
                fds.append(target)
            elif stream == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
                fds.append(fd)
                close.append(fd)
            elif stream == subprocess.PIPE:
                read, write = os.pipe()
                child, mine = (read, write) if target == 0 else (write, read)
                fds.append(child)
                close.append(child)
                mode = "wb" if target == 0 else "rb"
                setattr(self, ("stdin", "stdout", "stderr")[target], os.fdopen(mine, mode))
            elif stream == subprocess.STDOUT:
                fds.append(fds[1])
            elif isinstance(stream, int):
                fds.append(stream)
            else:
                fds.append(stream.fileno())
        return fds, close

    def poll(self) -> int | None:
        if self.returncode is None and self._wait_lock.acquire(blocking=False):
            try:
                self._read_status(0.0)
            except (BlockingIOError, TimeoutError):
                pass
            finally:
                self._wait_lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            with self._wait_lock:
                if self.returncode is None:
                    try:
                        self._read_status(left)
                    except TimeoutError:
                        pass
        return self.returncode

    def _receive(self) -> dict[str, int]:
        message = self._sock.recv(4096)
        if not message:
            raise RuntimeError("the zygote went away before this process ended")
        return dict(json.loads(message))

    def _read_status(self, timeout: float | None) -> None:
        self._sock.settimeout(timeout)  # 0.0: do not block
        self.returncode = os.waitstatus_to_exitcode(self._receive()["status"])
        self._sock.close()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    serve(sys.argv[1])
