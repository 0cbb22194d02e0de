"""A command whose call is cancelled (task timeout, cancel) does not outlive it in the sandbox."""

from __future__ import annotations

import asyncio
import uuid

from app.sandbox import DockerSandbox

IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


async def test_cancelled_exec_kills_its_process_tree(sandbox: DockerSandbox) -> None:
    mark = f"cx{uuid.uuid4().hex[:6]}"
    stubborn = f'python3 -c "{IGNORE_TERM}" {mark}'
    pattern = f"{mark[:-1]}[{mark[-1]}]"  # [x]: grep must not find its own command line
    count = ["sh", "-c", f"grep -ls '{pattern}' /proc/[0-9]*/cmdline | wc -l"]
    running = asyncio.create_task(sandbox.exec(["sh", "-c", f"({stubborn} &); {stubborn}"]))
    for _ in range(100):
        seen = await sandbox.exec(count, timeout_s=10)
        if int(seen.stdout) >= 2:  # both pythons (and the shell that started them)
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the command never started")
    running.cancel()
    done = await asyncio.gather(running, return_exceptions=True)
    assert isinstance(done[0], asyncio.CancelledError)
    left = await sandbox.exec(count, timeout_s=10)
    assert left.stdout.strip() == b"0", "the command and its child are gone"
