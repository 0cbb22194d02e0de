"""The in-sandbox end of a running task's file requests: list, read or write one path.

Stdlib only, Python 3.7+: `app.sandbox.task_files` reads this file's text and runs it
inside the container as `python3 -c <source> OP PATH ROOTS CAP`, so it needs no file
in the image. Nothing in Sandhive imports it.

Paths are resolved with the sandbox's own view (`os.path.realpath` follows the links the
agent planted, wherever they point) and refused unless the result lies in one of ROOTS
(a JSON list: the workdir and the scratch dirs). Then the resolved path is opened again
one component at a time, each with O_NOFOLLOW relative to its parent's descriptor, so a
link swapped in after the check is refused rather than followed.

Output on stdout: one JSON line (`{"error": KIND, "message": ...}` or the answer's
header), then for `read` the file's bytes. Always exit 0 once started.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from typing import Any

NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
CHUNK = 64 * 1024
OWNER_BITS = False


class Refused(Exception):
    def __init__(self, kind: str, message: str) -> None:
        Exception.__init__(self, message)
        self.kind, self.message = kind, message


def emit(header: dict[str, Any]) -> None:
    sys.stdout.buffer.write(json.dumps(header).encode() + b"\n")


def within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def resolve(path: str, roots: list[str]) -> tuple[str, list[str]]:
    """(root, [components below it]) of the path's real location; Refused when outside."""
    real = os.path.realpath(path)
    for root in roots:
        real_root = os.path.realpath(root)
        if within(real, real_root):
            rest = real[len(real_root) :].strip("/")
            return real_root, [part for part in rest.split("/") if part]
    raise Refused("outside", f"{path} resolves to {real}, outside the sandbox's writable area")


def open_dir(root: str, parts: list[str], create: bool = False) -> int:
    """A descriptor of root/parts..., walked without following any link."""
    fd = os.open(root, NOFOLLOW_DIR)
    try:
        for part in parts:
            try:
                child = os.open(part, NOFOLLOW_DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, NOFOLLOW_DIR, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError:
        os.close(fd)
        raise
    return fd


def kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def do_list(path: str, roots: list[str], cap: int) -> None:
    root, parts = resolve(path, roots)
    fd = open_dir(root, parts)
    entries: list[dict[str, Any]] = []
    unlisted = 0
    try:
        with os.scandir(fd) as found:
            for entry in found:
                try:
                    entry.name.encode("utf-8")
                    info = entry.stat(follow_symlinks=False)
                except (UnicodeEncodeError, OSError):
                    unlisted += 1
                    continue
                if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in entry.name):
                    unlisted += 1
                    continue
                entries.append(
                    {
                        "name": entry.name,
                        "type": kind_of(info.st_mode),
                        "size": info.st_size,
                        "mtime": info.st_mtime,
                    }
                )
    finally:
        os.close(fd)
    entries.sort(key=lambda item: item["name"])
    real = "/".join([root.rstrip("/"), *parts]) or "/"
    emit(
        {
            "path": real,
            "entries": entries[:cap],
            "truncated": len(entries) > cap,
            "unlisted": unlisted,
        }
    )


def open_final(path: str, roots: list[str], flags: int) -> int:
    root, parts = resolve(path, roots)
    if not parts:
        raise Refused("is_dir", f"{path} is a directory")
    fd = open_dir(root, parts[:-1])
    try:
        return os.open(parts[-1], flags | os.O_NOFOLLOW, dir_fd=fd)
    finally:
        os.close(fd)


def do_read(path: str, roots: list[str], cap: int) -> None:
    fd = open_final(path, roots, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise Refused("is_dir", f"{path} is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise Refused("not_file", f"{path} is not a regular file ({kind_of(info.st_mode)})")
        if not owner_may(info.st_mode, stat.S_IRUSR):
            raise Refused("forbidden", f"{path}: Permission denied (its owner may not read it)")
        if info.st_size > cap:
            raise Refused("too_large", f"{path} has {info.st_size} bytes, over the {cap}-byte cap")
        emit({"size": info.st_size, "mtime": info.st_mtime})
        left = info.st_size
        while left > 0:
            chunk = os.read(fd, min(CHUNK, left))
            if not chunk:
                break
            sys.stdout.buffer.write(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)


def do_write(path: str, roots: list[str], cap: int) -> None:
    data = sys.stdin.buffer.read(cap + 1)
    if len(data) > cap:
        raise Refused("too_large", f"over the {cap}-byte cap")
    root, parts = resolve(path, roots)
    if not parts:
        raise Refused("is_dir", f"{path} is a directory")
    parent = open_dir(root, parts[:-1], create=True)
    name, temp = parts[-1], f".sandhive-put-{os.getpid()}"
    try:
        mode = 0o644
        try:
            old = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if stat.S_ISDIR(old.st_mode):
                raise Refused("is_dir", f"{path} is a directory")
            if stat.S_ISREG(old.st_mode):
                mode = stat.S_IMODE(old.st_mode)
                if not owner_may(old.st_mode, stat.S_IWUSR):
                    raise Refused(
                        "forbidden", f"{path}: Permission denied (its owner may not write it)"
                    )
        except FileNotFoundError:
            pass
        fd = os.open(
            temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=parent
        )
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        # rename replaces whatever is at `name` (a link swapped in included) without
        # following it: the bytes land in the checked directory or nowhere.
        os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=parent)
        except OSError:
            pass
        raise
    finally:
        os.close(parent)
    emit({"size": len(data), "path": "/".join([root.rstrip("/"), *parts])})


def owner_may(mode: int, bit: int) -> bool:
    """With OWNER_BITS (a caller's own sandbox), root too is held to a file's owner bits:
    a file `chmod -w` is not overwritten, one `chmod -r` not read, as a harness expects of
    root in a container (Inspect's conformance checks); a task's requests are not."""
    return not OWNER_BITS or bool(mode & bit)


def main() -> None:
    global OWNER_BITS
    op, path, roots, cap = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
    OWNER_BITS = sys.argv[5:6] == ["owner-bits"]
    try:
        {"list": do_list, "read": do_read, "write": do_write}[op](path, roots, cap)
    except Refused as refused:
        emit({"error": refused.kind, "message": refused.message})
    except FileNotFoundError:
        emit({"error": "missing", "message": f"{path} does not exist"})
    except NotADirectoryError:
        emit({"error": "not_dir", "message": f"a component of {path} is not a directory"})
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link appeared where the checked path had none
            emit({"error": "outside", "message": f"{path} changed while it was opened"})
        elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
            emit({"error": "no_space", "message": f"{path}: the sandbox's disk is full"})
        elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            emit({"error": "forbidden", "message": f"{path}: {exc.strerror}"})
        else:
            emit({"error": "os", "message": f"{path}: {exc.strerror}"})
    sys.stdout.flush()


if __name__ == "__main__":
    main()
