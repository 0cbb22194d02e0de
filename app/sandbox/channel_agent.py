"""The in-sandbox end of the exec channel: runs commands sent as frames over stdin/stdout.

Stdlib only, Python 3.7+ (3.9+ for a command's `user`): `app.sandbox.channel` reads this
file's text and starts it inside the container with ONE
`docker exec -i python3 -I -S -c <source>`, so it needs no file in the image and no writable
path. Nothing in Sandhive imports it.

Frames, both ways: 8-byte header (two big-endian uint32: JSON length, payload
length), a JSON object, then the payload bytes.
  host -> agent: {"op": "run", "id", "argv", "cwd", "env", "stdin": bool, "linger"} + stdin
                 {"op": "shell", "id", "session", "command", "cwd", "env", "linger"}
                 {"op": "kill", "id"}
  agent -> host: {"ready": 1} once at start
                 {"id", "stream": "stdout"|"stderr"} + chunk, as the command prints
                 {"id", "exit": code} when its output ended and it exited
                 {"id", "killed": 1} once a kill request has been carried out
`linger` (seconds, optional): stop reading the output that long after the command
exited even if a background child still holds the pipes; closing our read ends gives
that child SIGPIPE on its next write. Without it the output is read to its end.
Each command runs in its own session (process group); a kill SIGKILLs the group and,
like the per-command `docker exec` path, every process carrying the command's
SANDHIVE_EXEC_ID mark (so `setsid` children go too).

`shell` runs the command inside a long-lived bash kept per `session` name, so `cd`,
variables and functions carry over; each command gets its own stdout/stderr pipes
(opened by the shell through /proc/<agent>/fd), and its exit status comes back on the
shell's own stdout. Exit frames of `shell` (and its kill reports) carry "ended": 1
when the shell is gone (the command ran `exit`, or a kill could not spare it); the
next command then starts a fresh one.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import shlex
import signal
import struct
import subprocess
import sys
import threading
import time

TYPE_CHECKING = False  # importing typing is ~3 ms of the agent's start; only mypy reads these
if TYPE_CHECKING:
    from typing import IO, Any

HEAD = struct.Struct(">II")
MARK = "SANDHIVE_EXEC_ID"
CHUNK = 65536
SPARE_S = 1.0
"""How long a kill keeps killing a shell command's processes before giving up the shell."""
REAP_WAIT_S = 2.0
"""How long a kill waits for the killed processes to be reaped (their pids freed)."""
REAP_POLL_S = 0.01
BASE_ENV = dict(os.environ)
LOCK = threading.Lock()
RUNNING: dict[int, tuple[subprocess.Popen[bytes], str]] = {}
KILLED: set[int] = set()
SESSIONS: dict[str, Session] = {}
SHELL_RUNNING: dict[int, ShellRun] = {}


class Session:
    """One persistent bash reading command lines on stdin, reporting statuses on stdout."""

    def __init__(self, cwd: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass


class ShellRun:
    """One command in flight in a session: what a kill needs to find and spare it."""

    def __init__(self, name: str, session: Session, token: str) -> None:
        self.name = name
        self.session = session
        self.token = token
        self.status = threading.Event()
        self.ended = False


def send(header: dict[str, Any], payload: bytes = b"") -> None:
    """Write one frame to stdout, whole (threads share the stream)."""
    data = json.dumps(header).encode()
    view = memoryview(HEAD.pack(len(data), len(payload)) + data + payload)
    with LOCK:
        while view:
            view = view[os.write(1, view) :]


def read_exact(size: int) -> bytes | None:
    """Exactly size bytes from stdin, or None at EOF."""
    buf = bytearray()
    while len(buf) < size:
        chunk = os.read(0, size - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def relay(rid: int, pipes: dict[int, str], wake: int, linger: float | None) -> None:
    """Forward output chunks until every writer is gone, or `linger` after the wake-up.

    One poll loop for both pipes; `wake` becomes readable once the command exited.
    The read ends are closed here, so a background writer left behind gets SIGPIPE.
    """
    poller = select.poll()
    for fd in pipes:
        poller.register(fd, select.POLLIN)
    if linger is not None:
        poller.register(wake, select.POLLIN)
    deadline = None
    while pipes:
        wait = None if deadline is None else (deadline - time.monotonic()) * 1000
        if wait is not None and wait <= 0:
            break  # past the grace, even if a background writer never pauses
        events = poller.poll(wait)
        for fd, _ in events:
            if fd == wake:
                poller.unregister(wake)
                deadline = time.monotonic() + (linger or 0.0)
                continue
            if fd not in pipes:
                continue
            chunk = os.read(fd, CHUNK)
            if chunk:
                send({"id": rid, "stream": pipes[fd]}, chunk)
            else:
                poller.unregister(fd)
                os.close(fd)
                del pipes[fd]
    for fd in pipes:
        os.close(fd)


def feed(pipe: IO[bytes], data: bytes) -> None:
    """Write the command's stdin then EOF; a command that stops reading is fine."""
    try:
        pipe.write(data)
    except OSError:
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def start_threads(threads: list[threading.Thread]) -> RuntimeError | None:
    """Start them all; the error when the pids ran out (a fork bomb) part way."""
    try:
        for thread in threads:
            thread.daemon = True
            thread.start()
    except RuntimeError as exc:
        return exc
    return None


def failed(rid: int, message: str) -> None:
    """Like `docker exec`: 126 and a message when a command cannot start."""
    send({"id": rid, "stream": "stderr"}, f"exec failed: {message}\n".encode())
    send({"id": rid, "exit": 126})


def as_user(user: object, env: dict[str, str]) -> dict[str, Any]:
    """Popen's arguments to run as `user` (a name or uid of the image's passwd), with its
    HOME, USER and LOGNAME in `env`, as `docker exec --user` does; LookupError naming it."""
    if not user:
        return {}
    import pwd

    name = str(user)
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, ValueError):
        raise LookupError(
            f"unable to find user {name}: no matching entries in passwd file"
        ) from None
    env.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name)
    groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": groups}


def run(rid: int, req: dict[str, Any], data: bytes) -> None:
    """Run one command to its end and report its exit code after all its output."""
    env = dict(BASE_ENV)
    try:
        ids = as_user(req.get("user"), env)
        env.update(req.get("env") or {})
        proc = subprocess.Popen(
            req["argv"],
            cwd=req.get("cwd") or "/",
            env=env,
            stdin=subprocess.PIPE if req.get("stdin") else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            **ids,
        )
    except (LookupError, OSError, ValueError, TypeError) as exc:
        # No such user, not executable, a NUL in an argument, Popen's `user` before 3.9:
        # the command cannot start, and the host must hear so (it would wait for an exit).
        failed(rid, str(exc))
        return
    RUNNING[rid] = (proc, env.get(MARK, ""))
    if rid in KILLED:  # the kill arrived while the command was starting
        kill(rid)
    assert proc.stdout is not None
    assert proc.stderr is not None
    # The relay owns (and closes) these read ends; the file objects let go of theirs.
    pipes = {os.dup(proc.stdout.fileno()): "stdout", os.dup(proc.stderr.fileno()): "stderr"}
    proc.stdout.close()
    proc.stderr.close()
    wake_r, wake_w = os.pipe()
    threads = [threading.Thread(target=relay, args=(rid, pipes, wake_r, req.get("linger")))]
    if proc.stdin is not None:
        threads.append(threading.Thread(target=feed, args=(proc.stdin, data)))
    error = start_threads(threads)
    if error is not None:  # out of pids: give the command up, stay up
        kill(rid, report=False)
        proc.wait()
        RUNNING.pop(rid, None)
        os.write(wake_w, b"x")
        if threads[0].ident is None:  # the relay never started: its pipes are ours to close
            for fd in pipes:
                os.close(fd)
        else:
            threads[0].join()
        os.close(wake_r)
        os.close(wake_w)
        failed(rid, str(error))
        return
    code = proc.wait()
    os.write(wake_w, b"x")
    for thread in threads:
        thread.join()
    os.close(wake_r)
    os.close(wake_w)
    RUNNING.pop(rid, None)
    send({"id": rid, "exit": 128 - code if code < 0 else code})


def shell(rid: int, req: dict[str, Any]) -> None:
    """Run one command line in the request's session, starting the session if needed."""
    name = str(req["session"])
    session = SESSIONS.get(name)
    try:
        if session is None or not session.alive():
            env = dict(BASE_ENV)
            env.update(req.get("env") or {})
            env.pop(MARK, None)
            session = SESSIONS[name] = Session(req.get("cwd") or "/", env)
    except OSError as exc:
        failed(rid, str(exc))
        return
    token = str((req.get("env") or {}).get(MARK) or os.urandom(12).hex())
    current = SHELL_RUNNING[rid] = ShellRun(name, session, token)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    wake_r, wake_w = os.pipe()
    me = os.getpid()
    # eval keeps a syntax error inside this command; the braces keep cd/export in the shell;
    # `builtin` so that a function the model defined (`printf() {...}`) cannot break this.
    line = (
        f"builtin export {MARK}={token}; {{ builtin eval {shlex.quote(req['command'])}\n}}"
        f" </dev/null >/proc/{me}/fd/{out_w} 2>/proc/{me}/fd/{err_w};"
        f" builtin printf '%s %d\\n' {token} \"$?\"\n"
    )
    pipes = {out_r: "stdout", err_r: "stderr"}
    thread = threading.Thread(target=relay, args=(rid, pipes, wake_r, req.get("linger")))
    error = start_threads([thread])
    if error is not None:
        for fd in (out_r, out_w, err_r, err_w, wake_r, wake_w):
            os.close(fd)
        SHELL_RUNNING.pop(rid, None)
        failed(rid, str(error))
        return
    if rid in KILLED:
        session.stop()
    code = wait_status(session, line, token)
    current.ended = code is None
    if code is None:
        code = session.proc.wait()
        code = 128 - code if code < 0 else code
        if SESSIONS.get(name) is session:
            del SESSIONS[name]
    current.status.set()
    os.close(out_w)  # our copies: the output ends once the command's own writers are gone
    os.close(err_w)
    os.write(wake_w, b"x")
    thread.join()
    os.close(wake_r)
    os.close(wake_w)
    SHELL_RUNNING.pop(rid, None)
    send({"id": rid, "exit": code, "ended": int(current.ended)})


def wait_status(session: Session, line: str, token: str) -> int | None:
    """Send the line and read the shell's stdout up to its status; None if the shell died."""
    stdin, stdout = session.proc.stdin, session.proc.stdout
    assert stdin is not None
    assert stdout is not None
    try:
        stdin.write(line.encode())
        stdin.flush()
    except OSError:
        return None
    prefix = token.encode() + b" "
    while True:
        got = stdout.readline()
        if not got:
            return None
        if got.startswith(prefix):
            try:
                return int(got[len(prefix) :])
            except ValueError:  # the command wrote to the shell's status pipe: give it up
                session.stop()
                return None


def marked(token: str) -> list[int]:
    """Pids of processes whose environment carries MARK=token."""
    want = f"{MARK}={token}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def kill_marked(token: str, spare: int = 0) -> list[int]:
    """SIGKILL every process with the mark but `spare`: the pids it found."""
    found = [pid for pid in (marked(token) if token else ()) if pid != spare]
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return found


def kill(rid: int, report: bool = True) -> None:
    """SIGKILL the command's process group and every process with its mark until both are gone.

    "Gone" means reaped, not only signalled: a killed process holds its pid (and the
    sandbox's pids budget) as a zombie until its parent or init waits for it, so a command
    sent just after "killed" could still find no pid to fork. The wait is bounded by
    REAP_WAIT_S; the first two rounds always run, for forks that were under way.
    """
    KILLED.add(rid)
    item = RUNNING.get(rid)
    if item is not None:
        proc, token = item
        deadline = time.monotonic() + REAP_WAIT_S
        for round_ in itertools.count():
            left = False
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # succeeds while a zombie of it is unreaped
                left = True
            except OSError:
                pass
            escaped = kill_marked(token)
            if round_ >= 1 and (not (left or escaped) or time.monotonic() > deadline):
                break
            time.sleep(REAP_POLL_S)
    if report:
        send({"id": rid, "killed": 1})


def kill_shell(rid: int, current: ShellRun) -> None:
    """Kill what the command started and keep its shell if the shell then reports back.

    A command running in the shell itself (a builtin loop, a subshell) never reports
    back: after SPARE_S the whole session goes, and the next command gets a new one.
    """
    deadline = time.monotonic() + SPARE_S
    pid = current.session.proc.pid
    while time.monotonic() < deadline:
        kill_marked(current.token, spare=pid)
        if current.status.wait(0.05):
            break
    else:
        current.session.stop()
        if SESSIONS.get(current.name) is current.session:
            del SESSIONS[current.name]
        current.status.wait(SPARE_S)
    send({"id": rid, "killed": 1, "ended": int(current.ended or not current.session.alive())})


def dispatch(req: dict[str, Any], data: bytes) -> None:
    """Handle one request; commands (and shell kills, which wait) get a thread each."""
    rid = req["id"]
    if req.get("op") == "kill":
        current = SHELL_RUNNING.get(rid)
        if current is None:
            kill(rid)
            return
        KILLED.add(rid)
        if start_threads([threading.Thread(target=kill_shell, args=(rid, current))]):
            current.session.stop()  # out of pids: no thread to wait for it, give it up
            send({"id": rid, "killed": 1, "ended": 1})
        return
    if req.get("op") == "shell":
        thread = threading.Thread(target=shell, args=(rid, req))
    else:
        thread = threading.Thread(target=run, args=(rid, req, data))
    error = start_threads([thread])
    if error is not None:  # out of pids: this command fails, the agent lives
        failed(rid, str(error))


def main() -> None:
    send({"ready": 1})
    while True:
        head = read_exact(HEAD.size)
        if head is None:
            break
        size, length = HEAD.unpack(head)
        body = read_exact(size)
        data = read_exact(length) if length else b""
        if body is None or data is None:
            break
        dispatch(json.loads(body.decode()), data)
    for rid in list(RUNNING):
        kill(rid)
    for session in list(SESSIONS.values()):
        session.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
