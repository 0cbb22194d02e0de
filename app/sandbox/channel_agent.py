"""The in-sandbox end of the exec channel: runs commands sent as frames over stdin/stdout.

Stdlib only, Python 3.7+: `app.sandbox.channel` reads this file's text and starts it
inside the container with ONE `docker exec -i python3 -c <source>`, so it needs no
file in the image and no writable path. Nothing in Sandhive imports it.

Frames, both ways: 8-byte header (two big-endian uint32: JSON length, payload
length), a JSON object, then the payload bytes.
  host -> agent: {"op": "run", "id", "argv", "cwd", "env", "stdin": bool} + stdin bytes
                 {"op": "kill", "id"}
  agent -> host: {"ready": 1} once at start
                 {"id", "stream": "stdout"|"stderr"} + chunk, as the command prints
                 {"id", "exit": code} when its output ended and it exited
                 {"id", "killed": 1} once a kill request has been carried out
Each command runs in its own session (process group); a kill SIGKILLs the group and,
like the per-command `docker exec` path, every process carrying the command's
SANDHIVE_EXEC_ID mark (so `setsid` children go too).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
from typing import IO, Any

HEAD = struct.Struct(">II")
MARK = "SANDHIVE_EXEC_ID"
CHUNK = 65536
BASE_ENV = dict(os.environ)
LOCK = threading.Lock()
RUNNING: dict[int, tuple[subprocess.Popen[bytes], str]] = {}
KILLED: set[int] = set()


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


def pump(rid: int, name: str, pipe: IO[bytes]) -> None:
    """Forward one output pipe, chunk by chunk, until its writers are gone."""
    fd = pipe.fileno()
    while True:
        chunk = os.read(fd, CHUNK)
        if not chunk:
            break
        send({"id": rid, "stream": name}, chunk)
    pipe.close()


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


def run(rid: int, req: dict[str, Any], data: bytes) -> None:
    """Run one command to its end and report its exit code after all its output."""
    env = dict(BASE_ENV)
    env.update(req.get("env") or {})
    try:
        proc = subprocess.Popen(
            req["argv"],
            cwd=req.get("cwd") or "/",
            env=env,
            stdin=subprocess.PIPE if req.get("stdin") else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:  # like `docker exec`: 126 and a message when it cannot start
        send({"id": rid, "stream": "stderr"}, f"exec failed: {exc}\n".encode())
        send({"id": rid, "exit": 126})
        return
    RUNNING[rid] = (proc, env.get(MARK, ""))
    if rid in KILLED:  # the kill arrived while the command was starting
        kill(rid)
    threads = [
        threading.Thread(target=pump, args=(rid, "stdout", proc.stdout)),
        threading.Thread(target=pump, args=(rid, "stderr", proc.stderr)),
    ]
    if proc.stdin is not None:
        threads.append(threading.Thread(target=feed, args=(proc.stdin, data)))
    for thread in threads:
        thread.daemon = True
        thread.start()
    code = proc.wait()
    for thread in threads:
        thread.join()
    RUNNING.pop(rid, None)
    send({"id": rid, "exit": 128 - code if code < 0 else code})


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


def kill(rid: int) -> None:
    """SIGKILL the command's process group and every process with its mark, twice."""
    KILLED.add(rid)
    item = RUNNING.get(rid)
    if item is not None:
        proc, token = item
        for _ in range(2):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            for pid in marked(token) if token else ():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    send({"id": rid, "killed": 1})


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
        req = json.loads(body.decode())
        if req.get("op") == "kill":
            kill(req["id"])
        else:
            thread = threading.Thread(target=run, args=(req["id"], req, data))
            thread.daemon = True
            thread.start()
    for rid in list(RUNNING):
        kill(rid)
    sys.exit(0)


if __name__ == "__main__":
    main()
