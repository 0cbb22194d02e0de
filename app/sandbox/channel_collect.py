"""Output collection through the exec channel: `tar -c` in the sandbox, parsed as it streams.

Docker 20.10's archive API (`GET /containers/{id}/archive`) re-executes dockerd
(`docker-tar`, a chroot'ed child) for every call: ~20-40 ms of daemon CPU and a round
trip on a busy daemon at the end of each task, on its critical path. The channel is
already open, so the same tar comes from the sandbox's own `tar` instead, into the same
hardened reader (`app.sandbox.files.collect_tar`, which trusts nothing in the stream: the
archive API's tar of sandbox-made files was no more trustworthy).

The caller falls back to the archive API whenever this returns None: no channel, no
`sh`/`tar` in the image, tar failing, or the stream growing past
`CollectCaps.max_channel_bytes` (a bound on what the worker buffers, since channel frames
have no backpressure; a huge or sparse output then goes through the archive API, which
streams with backpressure).
Imported by `app.sandbox.docker`.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from app.agent.types import ExecResult, OutputCallback
from app.sandbox.files import CollectCaps, Collected, collect_tar

MISSING = 3
EXIT_WAIT_S = 5.0
TAR_SCRIPT = (
    '[ -e "$1/$2" ] || [ -L "$1/$2" ] || exit 3; cd -- "$1" && exec tar -c -f - --sort=name -- "$2"'
)
"""Archive $1/$2 as `$2/...` (the archive API's layout); exit 3 when it does not exist.
GNU tar, like the archive API, stores a symlink named on its command line as a link, and
`--sort=name` walks in the archive API's (Go's) lexical order, so the same files come
first under `max_files` and the same one of two hard links is the regular member. A tar
without `--sort` (busybox) fails, and so does any other tar error (even GNU tar's 1, "a
file changed as we read it"): the archive API takes over."""

Exec = Callable[..., Coroutine[Any, Any, ExecResult]]


async def collect_through_channel(exec_: Exec, path: str, caps: CollectCaps) -> Collected | None:
    """`path` collected by tar over the channel (`exec_`: `DockerSandbox.exec`), or None."""
    parent, name = posixpath.split(path)
    stream = asyncio.StreamReader()
    fed, over = 0, False

    async def feed(kind: str, data: bytes) -> None:
        nonlocal fed, over
        if kind != "stdout" or over:
            return
        fed += len(data)
        if fed > caps.max_channel_bytes:
            over = True
            run.cancel()  # the channel kills the tar; the archive API takes over
            return
        stream.feed_data(data)

    argv: Sequence[str] = ["sh", "-c", TAR_SCRIPT, "sh", parent or "/", name]
    on_output: OutputCallback = feed
    run: asyncio.Task[ExecResult] = asyncio.create_task(
        exec_(argv, workdir="/", on_output=on_output)
    )
    run.add_done_callback(lambda _: stream.feed_eof())
    try:
        collected = await collect_tar(stream, path, caps)
        if not over:  # the end marker came: the exit status follows at once
            await asyncio.wait({run}, timeout=EXIT_WAIT_S)
    finally:
        if not run.done():
            run.cancel()  # the reader stopped early (caps): the tar must not go on
        await asyncio.gather(run, return_exceptions=True)
    if over:
        return None
    if run.cancelled():
        return collected  # stopped by the reader (caps, a bad stream): its verdict stands
    if run.exception() is not None:
        return None
    done = run.result()
    if done.exit_code == MISSING and fed == 0:
        return Collected()
    return collected if done.exit_code == 0 else None
