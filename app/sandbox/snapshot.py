"""A sandbox's writable files as one tar, and that tar put into a new sandbox: a fork.

With the default fresh shell nothing of a sandbox outlives a command but its files, and it
can only write to the workdir and the scratch tmpfs directories (`SCRATCH_DIRS`, a verified
task's extra ones): the image below is read-only, and the same in every sandbox of that
image. So a tar of those directories, taken between two steps, is the sandbox's state, and
a new sandbox of the same shape with it unpacked is the same computer.

The tar is made by the sandbox's own GNU `tar` (Debian's; busybox's lacks the options) over
the exec channel (`docker exec` without one), streamed into the worker's memory and cut at
`max_bytes`, which refuses a snapshot before any child exists. It goes back with `tar -x`
after the directories are emptied (a fresh sandbox's own setup files, or its inputs, must
not outlive the parent's deletions), through the channel when small; a large one by `docker
exec` (`direct`), whose stdin streams, since the channel agent would hold the whole archive
in the sandbox's memory, which its limit counts beside the tmpfs the files fill. The
archive is untrusted (sandboxed code made it) but is only ever unpacked inside a sandbox of
the same tenant, never parsed here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from app.errors import SandboxError
from app.sandbox.docker import DockerSandbox
from app.sandbox.policy import SCRATCH_DIRS, SandboxConfig

SNAPSHOT_TIMEOUT_S = 600.0
RESTORE_TIMEOUT_S = 600.0
CHANNEL_MAX_BYTES = 16 * 2**20
"""Archives up to this size go back through the exec channel (~5 ms), larger ones by
`docker exec` (~40 ms more, but streamed)."""
TAR_SCRIPT = (
    'cd / && for d in "$@"; do [ -d "$d" ] && set -- "$@" "$d"; shift; done; '
    'exec tar -c -f - --numeric-owner --warning=no-file-changed -- "$@"'
)
"""Archive the named directories (relative to /) that exist. Exit 1 is GNU tar's "a file
changed as we read it" (a process the agent left running): the snapshot is still whole."""
RESTORE_SCRIPT = (
    'for d in "$@"; do if [ -d "/$d" ]; then find "/$d" -mindepth 1 -delete || exit 3; fi; done;'
    " cd / && exec tar -x -f - --numeric-owner -p"
)
"""Empty the directories (a file the parent deleted must not stay), then unpack."""
SHM = "/dev/shm"
"""Docker's shared-memory tmpfs: writable in every container, so copied too."""


class SnapshotTooLarge(SandboxError):
    """The writable files are more than a snapshot may hold."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the sandbox's files are over the snapshot limit of {limit} bytes")
        self.limit = limit


def writable_dirs(config: SandboxConfig) -> list[str]:
    """The directories a sandbox of this shape can write to, relative to /."""
    paths = [config.workdir, *SCRATCH_DIRS, *config.extra_scratch, SHM]
    return [path.strip("/") for path in dict.fromkeys(paths)]


class Unpack:
    """One new sandbox's hold on a snapshot: it lets go of the bytes once they are unpacked,
    so a fork's child keeps its parent's files only until its own sandbox has them."""

    def __init__(self, archive: bytes) -> None:
        self._archive: bytes | None = archive

    def take(self) -> bytes:
        archive, self._archive = self._archive, None
        if archive is None:
            raise SandboxError("the snapshot was unpacked already")
        return archive


async def take(box: DockerSandbox, max_bytes: int) -> bytes:
    """The sandbox's writable directories as a tar; `SnapshotTooLarge` past `max_bytes`."""
    parts: list[bytes] = []
    size, over = 0, False

    async def keep(stream: str, chunk: bytes) -> None:
        nonlocal size, over
        if stream != "stdout" or over:
            return
        size += len(chunk)
        if size > max_bytes:
            over = True
            run.cancel()  # the channel kills the tar
            return
        parts.append(chunk)

    argv: Sequence[str] = ["sh", "-c", TAR_SCRIPT, "sh", *writable_dirs(box.config)]
    run = asyncio.ensure_future(
        box.exec(argv, workdir="/", on_output=keep, timeout_s=SNAPSHOT_TIMEOUT_S)
    )
    try:
        done = await run
    except asyncio.CancelledError:
        if not over:
            raise
        raise SnapshotTooLarge(max_bytes) from None
    if over:
        raise SnapshotTooLarge(max_bytes)
    if done.timed_out or done.exit_code not in (0, 1):
        detail = done.stderr.decode(errors="replace")[-2000:]
        raise SandboxError(f"could not snapshot the sandbox ({done.exit_code}): {detail}")
    return b"".join(parts)


async def restore(box: DockerSandbox, archive: bytes) -> None:
    """Empty the sandbox's writable directories, then unpack `take`'s archive into them."""
    argv = ["sh", "-c", RESTORE_SCRIPT, "sh", *writable_dirs(box.config)]
    done = await box.exec(
        argv,
        workdir="/",
        stdin=archive,
        timeout_s=RESTORE_TIMEOUT_S,
        direct=len(archive) > CHANNEL_MAX_BYTES,
    )
    if done.timed_out or done.exit_code != 0:
        detail = done.stderr.decode(errors="replace")[-2000:]
        raise SandboxError(f"could not restore the snapshot ({done.exit_code}): {detail}")
