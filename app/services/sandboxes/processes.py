"""Processes and file operations of a sandbox addressed as E2B's envd addresses them: by a pid
that outlives the request that started it, and by path with a file's full information.

A command started this way (`start`) runs as any command of the sandbox (its audit log,
its limits) with one more variable, `SANDHIVE_E2B_PID`, numbered per sandbox in Redis;
every process it starts inherits it, so a signal (`signal`) reaches the command's whole
tree from any API process, and `listing` finds what still runs. The file operations
(`fs`) run a small Python program in the sandbox that answers one JSON line (every
sandbox image has Python: its command channel is Python). Nothing here keeps state in the
API process.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from app.bus import keys
from app.config import Settings
from app.db.engine import Sessions
from app.errors import AppError, Conflict, Forbidden, InvalidInput, NotFound, SandboxError
from app.schemas.sandboxes import ExecRequest, ExecResult
from app.services.sandboxes import calls, commands

PID_ENV = "SANDHIVE_E2B_PID"
STDIN_DIR = "/tmp/.sandhive-e2b"
"""Where a process started with stdin keeps its FIFO (`stdin-PID`) and the FIFO's holder."""
PID_TTL_S = 7 * 24 * 3600
"""How long a sandbox's pid counter is kept after its last command (longer than any life)."""
OP_TIMEOUT_S = 60.0

SIGNAL_SCRIPT = f"""
tag="{PID_ENV}=$1"; found=1
for dir in /proc/[0-9]*; do
  pid=${{dir#/proc/}}
  [ "$pid" = "$$" ] && continue
  if tr '\\0' '\\n' < "$dir/environ" 2>/dev/null | grep -qx "$tag"; then
    kill -s "$2" "$pid" 2>/dev/null && found=0
  fi
done
exit $found
"""
"""`sh -c SIGNAL_SCRIPT sh PID SIGNAL`: exit 1 when no process of that pid was found."""

WITH_STDIN = """
f="$1/stdin-$2"; shift 2
mkdir -p "$(dirname "$f")" && rm -f "$f" && mkfifo -m 600 "$f" || exit 126
( echo "$BASHPID" > "$f.holder"; exec sleep 2147483647 ) > "$f" &
"$@" < "$f"; code=$?
kill "$(cat "$f.holder" 2>/dev/null)" 2>/dev/null; rm -f "$f" "$f.holder"
exit $code
"""
"""`bash -c WITH_STDIN bash DIR PID ARGV...`: ARGV reads a FIFO that a sleeping holder keeps
open for writing, so input sent later (`send_input`, one writer each time) never ends it;
killing the holder (`close_stdin`) is its EOF. Both go when the command ends."""
_AWAIT = 'n=0; until [ -{kind} "{path}" ]; do n=$((n+1)); [ $n -gt 40 ] && exit 3; sleep 0.05; done'
"""Wait up to 2 s for the FIFO (or its holder's pid file): a command started in the background
makes them as its first act, and the SDK may send its input the moment `start` returns."""
SEND_INPUT = _AWAIT.format(kind="p", path="$1") + '; exec timeout 10 sh -c \'cat > "$1"\' sh "$1"'
CLOSE_INPUT = _AWAIT.format(kind="s", path="$1.holder") + '; kill "$(cat "$1.holder")"'

FS_PROGRAM = r"""
import grp, json, os, pwd, shutil, stat, sys

def owner(table, key):
    try:
        return table(key)[0]
    except KeyError:
        return str(key)

def info(path):
    st = os.lstat(path)
    link = stat.S_ISLNK(st.st_mode)
    target = None
    if link:
        target = os.path.realpath(path)
        try:
            st = os.stat(path)
        except OSError:
            pass
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
    return {"name": os.path.basename(path.rstrip("/")) or path, "path": path, "type": kind,
            "size": st.st_size, "mode": stat.S_IMODE(st.st_mode),
            "permissions": stat.filemode(st.st_mode), "owner": owner(pwd.getpwuid, st.st_uid),
            "group": owner(grp.getgrgid, st.st_gid), "mtime": st.st_mtime,
            "symlink_target": target, "is_symlink": link}

def walk(path, depth):
    found = []
    for name in sorted(os.listdir(path)):
        child = os.path.join(path, name)
        found.append(info(child))
        if depth > 1 and os.path.isdir(child) and not os.path.islink(child):
            found.extend(walk(child, depth - 1))
    return found

op, args = sys.argv[1], sys.argv[2:]
try:
    path = os.path.abspath(args[0])
    if op == "stat":
        out = info(path)
    elif op == "list":
        if not os.path.isdir(path):
            raise NotADirectoryError(path)
        out = walk(path, int(args[1]))
    elif op == "mkdir":
        if os.path.lexists(path):
            raise FileExistsError(path)
        os.makedirs(path)
        out = info(path)
    elif op == "remove":
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
        out = {}
    elif op == "move":
        destination = os.path.abspath(args[1])
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        shutil.move(path, destination)
        out = info(destination)
    else:
        raise ValueError(op)
    print(json.dumps({"ok": out}))
except FileNotFoundError as e:
    print(json.dumps({"missing": str(e)}))
except FileExistsError as e:
    print(json.dumps({"exists": str(e)}))
except NotADirectoryError as e:
    print(json.dumps({"invalid": "not a directory: %s" % e}))
except PermissionError as e:
    print(json.dumps({"forbidden": str(e)}))
except OSError as e:
    print(json.dumps({"invalid": str(e)}))
"""


LIST_PROGRAM = f"""
import json, os
found = {{}}
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        env = open("/proc/%s/environ" % pid, "rb").read().split(b"\\0")
        argv = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\\0")[:-1]
        cwd = os.readlink("/proc/%s/cwd" % pid)
    except OSError:
        continue
    tags = [e.split(b"=", 1)[1] for e in env if e.startswith(b"{PID_ENV}=")]
    tags = [tag for tag in tags if tag.isdigit()]
    if tags and int(pid) < found.get(tags[0], [1 << 62])[0]:
        found[tags[0]] = [int(pid), [a.decode("utf-8", "replace") for a in argv], cwd]
print(json.dumps([[int(tag), argv, cwd] for tag, (_, argv, cwd) in found.items()]))
"""
"""Every pid's first process (its oldest) still running: `[[pid, argv, cwd], ...]`."""


class Exists(Conflict):
    """The path exists already (a directory to make)."""


@dataclass(frozen=True)
class Caller:
    """Who acts on which of its sandboxes, with what (every call here takes one)."""

    sessions: Sessions
    redis: Redis
    settings: Settings
    tenant: str
    key_id: str | None
    """The API key's id, for the sandbox's command log."""
    sandbox_id: str

    async def run(self, body: ExecRequest, *, urgent: bool = False) -> ExecResult:
        """Run a helper command; ValidationError of a bad path or user is InvalidInput."""
        return await commands.run(
            self.sessions,
            self.redis,
            self.settings,
            self.tenant,
            self.key_id,
            self.sandbox_id,
            body,
            urgent=urgent,
        )

    async def held(self) -> None:
        """NotFound or Conflict unless the sandbox is the tenant's and runs."""
        await calls.held(self.sessions, self.tenant, self.sandbox_id)


def _user_key(sandbox_id: str, pid: int) -> str:
    """The user a pid's command runs as, when not root (its signal is sent as that user)."""
    return f"{keys.PREFIX}:e2b:{sandbox_id}:user:{pid}"


async def new_pid(redis: Redis, sandbox_id: str) -> int:
    key = f"{keys.PREFIX}:e2b:{sandbox_id}:pids"
    async with redis.pipeline(transaction=True) as pipe:
        pipe.incr(key)
        pipe.expire(key, PID_TTL_S)
        pid, _ = await pipe.execute()
    return int(pid)


async def start(
    caller: Caller, body: ExecRequest, *, stdin: bool = False
) -> tuple[int, AsyncGenerator[tuple[str, dict[str, Any] | None], None]]:
    """Run `body` as a process with a pid; (its pid, its events as `commands.stream` gives
    them). `stdin`: its input comes later (`send_input`, then `close_stdin`)."""
    await caller.held()  # no counter for a sandbox the caller has not
    pid = await new_pid(caller.redis, caller.sandbox_id)
    if body.user not in (None, "root", "0"):
        await caller.redis.set(_user_key(caller.sandbox_id, pid), body.user, ex=PID_TTL_S)
    update: dict[str, Any] = {"env": {**body.env, PID_ENV: str(pid)}}
    if stdin:
        wrapper = ["bash", "-c", WITH_STDIN, "bash", STDIN_DIR, str(pid)]
        update["argv"] = [*wrapper, *(body.argv or [])]
    tagged = body.model_copy(update=update)
    c = caller
    events = await commands.stream(
        c.sessions, c.redis, c.settings, c.tenant, c.key_id, c.sandbox_id, tagged
    )
    return pid, events


async def signal(caller: Caller, pid: int, name: str) -> None:
    """Send signal `name` (`KILL`, `TERM`) to every process of `pid`; NotFound if none runs.
    As the command's own user (root cannot read another user's /proc/PID/environ without
    CAP_SYS_PTRACE, which sandboxes lack), and without waiting for the sandbox's turn."""
    user = await caller.redis.get(_user_key(caller.sandbox_id, pid))
    body = ExecRequest(
        argv=["sh", "-c", SIGNAL_SCRIPT, "sh", str(pid), name],
        user=user.decode() if isinstance(user, bytes) else user,
        timeout_s=OP_TIMEOUT_S,
    )
    if (await caller.run(body, urgent=True)).exit_code != 0:
        raise NotFound(f"process with pid {pid} not found")


async def send_input(caller: Caller, pid: int, data: bytes) -> None:
    """Write `data` to the stdin of process `pid` (started with `stdin`); NotFound if it
    has none open."""
    body = ExecRequest(
        argv=["sh", "-c", SEND_INPUT, "sh", f"{STDIN_DIR}/stdin-{pid}"],
        stdin=base64.b64encode(data).decode(),
        stdin_encoding="base64",
        timeout_s=OP_TIMEOUT_S,
    )
    if (await caller.run(body)).exit_code != 0:
        raise NotFound(f"process with pid {pid} has no open stdin")


async def close_stdin(caller: Caller, pid: int) -> None:
    """End the input of process `pid` (EOF); NotFound if it has none open."""
    body = ExecRequest(
        argv=["sh", "-c", CLOSE_INPUT, "sh", f"{STDIN_DIR}/stdin-{pid}"], timeout_s=OP_TIMEOUT_S
    )
    if (await caller.run(body, urgent=True)).exit_code != 0:
        raise NotFound(f"process with pid {pid} has no open stdin")


async def listing(caller: Caller) -> list[tuple[int, list[str], str]]:
    """The processes started by `start` that still run: (pid, argv, cwd) each."""
    done = await caller.run(
        ExecRequest(argv=["python3", "-c", LIST_PROGRAM], timeout_s=OP_TIMEOUT_S)
    )
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise SandboxError(f"listing the processes failed: {done.stderr.strip()[-500:]}") from None
    return [(int(pid), list(argv), str(cwd)) for pid, argv, cwd in found]


async def fs(caller: Caller, op: str, *args: str, user: str | None = None) -> Any:
    """One file operation (`stat`, `list` PATH DEPTH, `mkdir`, `remove`, `move` SRC DST)
    in the sandbox: its result, or NotFound, Exists, Forbidden, InvalidInput."""
    done = await caller.run(
        ExecRequest(
            argv=["python3", "-c", FS_PROGRAM, op, *args], user=user, timeout_s=OP_TIMEOUT_S
        )
    )
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or len(answer) != 1:
        raise SandboxError(f"the file operation failed: {done.stderr.strip()[-500:]}")
    kind, value = next(iter(answer.items()))
    errors: dict[str, type[AppError]] = {
        "missing": NotFound,
        "exists": Exists,
        "forbidden": Forbidden,
        "invalid": InvalidInput,
    }
    if kind in errors:
        raise errors[kind](str(value))
    return value
