"""The exec channel: commands go through one long-lived in-sandbox agent, not `docker exec`.

The whole sandbox/agent suite (golden file included) already runs through the channel,
since it is the default; these tests prove it is really used, that concurrent commands
do not mix, and that the per-command `docker exec` path takes over when it is missing.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiodocker.containers import DockerContainer

from app.sandbox import DockerHost, DockerSandbox, SandboxConfig
from app.sandbox.channel import ExecChannel
from app.sandbox.docker import MAX_CHANNEL_OPENS
from tests.sandbox.conftest import MakeSandbox


async def agents_running(box: DockerSandbox) -> int:
    """How many channel agents run in the sandbox (counted without the channel's help)."""
    found = await box.exec(
        ["sh", "-c", "grep -ls 'SANDHIVE_EXEC_I[D]' /proc/[0-9]*/cmdline | wc -l"]
    )
    return int(found.stdout)


async def test_sandbox_commands_go_through_one_agent(sandbox: DockerSandbox) -> None:
    assert sandbox.uses_channel
    first = await sandbox.exec(["sh", "-c", "echo $PPID; cat /proc/$PPID/cmdline | head -c 7"])
    second = await sandbox.exec(["sh", "-c", "echo $PPID"])
    parent, cmdline = first.stdout.decode().split("\n", 1)
    assert cmdline == "python3", "the command's parent is the agent"
    assert second.stdout.decode().strip() == parent, "both ran under the same agent"
    assert await agents_running(sandbox) == 1


async def test_concurrent_commands_keep_their_own_output(sandbox: DockerSandbox) -> None:
    async def run(n: int) -> tuple[int, bytes, bytes]:
        script = (
            f"for i in 1 2 3; do echo out{n}-$i; echo err{n}-$i >&2; sleep 0.0{n}; done; exit {n}"
        )
        done = await sandbox.exec(["sh", "-c", script])
        return done.exit_code, done.stdout, done.stderr

    results = await asyncio.gather(*(run(n) for n in range(1, 9)))
    for n, (code, out, err) in enumerate(results, start=1):
        assert code == n
        assert out == b"".join(f"out{n}-{i}\n".encode() for i in (1, 2, 3))
        assert err == b"".join(f"err{n}-{i}\n".encode() for i in (1, 2, 3))


async def test_command_that_cannot_start_gets_126(sandbox: DockerSandbox) -> None:
    done = await sandbox.exec(["no-such-program-here"])
    assert done.exit_code == 126
    assert b"no-such-program-here" in done.stderr


async def test_missing_interpreter_means_no_channel(sandbox: DockerSandbox) -> None:
    container: DockerContainer = sandbox._container  # the raw container, to start a second agent
    assert await ExecChannel.open(container, 1024, interpreter="no-such-python") is None


async def test_a_lost_agent_is_replaced_a_few_times_then_docker_exec_takes_over(
    sandbox: DockerSandbox,
) -> None:
    for _ in range(MAX_CHANNEL_OPENS - 1):
        killed = await sandbox.exec(["sh", "-c", "echo before; kill -9 $PPID; sleep 5"])
        # The command in flight returns (it never hangs or fails the task) and says why.
        assert killed.exit_code == 126
        assert b"command runner was stopped" in killed.stderr
        done = await sandbox.exec(["sh", "-c", "echo still here"])
        assert done.stdout == b"still here\n"
        assert sandbox.uses_channel, "the next command started a new agent"
        assert await agents_running(sandbox) == 1
    await sandbox.exec(["sh", "-c", "kill -9 $PPID; sleep 5"])  # the last agent allowed
    done = await sandbox.exec(["sh", "-c", "echo still here"])
    assert done.stdout == b"still here\n"
    assert not sandbox.uses_channel, "past the budget, commands go through docker exec"


async def test_a_forged_oversized_frame_drops_the_channel_not_the_worker(
    sandbox: DockerSandbox,
) -> None:
    # Sandboxed code writes a frame header announcing ~4 GB to the agent's stdout.
    forged = "printf '\\000\\000\\000\\002\\377\\377\\377\\377' > /proc/$PPID/fd/1; sleep 5"
    result = await sandbox.exec(["sh", "-c", forged])
    assert result.exit_code == 126
    assert b"command runner was stopped" in result.stderr
    done = await sandbox.exec(["sh", "-c", "echo fine"])
    assert done.stdout == b"fine\n"
    assert await agents_running(sandbox) == 1


async def test_out_of_pids_fails_the_command_not_the_channel(make_sandbox: MakeSandbox) -> None:
    box = await make_sandbox(pids_limit=64)
    hog = asyncio.create_task(
        # bash, not dash: a fork that fails makes dash exit (freeing a pid for `true` on a
        # slow machine), while bash retries it and stays, so the cap stays hit.
        box.exec(["bash", "-c", "for i in $(seq 200); do sleep 30 & done; wait"], timeout_s=20)
    )
    try:
        starved = None
        for _ in range(100):
            starved = await box.exec(["true"])
            if starved.exit_code == 126:
                break
            await asyncio.sleep(0.1)
        assert starved is not None
        assert starved.exit_code == 126, "the pids cap was never hit"
        assert box.uses_channel, "the agent survived having no pids left"
    finally:
        hog.cancel()
        await asyncio.gather(hog, return_exceptions=True)
    assert box.uses_channel
    # The kill is reported once the hog's processes are reaped, so their pids are free again.
    done = await box.exec(["sh", "-c", "echo recovered"])
    assert (done.exit_code, done.stdout) == (0, b"recovered\n"), done.stderr


async def test_channel_can_be_turned_off(docker_image: str, test_labels: dict[str, str]) -> None:
    async with DockerHost(exec_channel=False) as host:
        box = await host.create_sandbox(
            SandboxConfig(image=docker_image, labels=test_labels, memory_mb=512)
        )
        try:
            assert not box.uses_channel
            done = await box.exec(["sh", "-c", "echo direct"])
            assert done.stdout == b"direct\n"
        finally:
            await box.remove()


async def test_removing_the_sandbox_closes_the_channel(make_sandbox: MakeSandbox) -> None:
    box = await make_sandbox()
    assert box.uses_channel
    await box.remove()
    assert not box.uses_channel


async def test_channel_never_blocks_the_event_loop(
    sandbox: DockerSandbox, caplog: pytest.LogCaptureFixture
) -> None:
    """asyncio's debug mode logs every callback slower than the threshold: there is none."""
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = 0.2  # a blocking Docker call or a sync read takes far longer
    try:
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            for _ in range(10):
                await sandbox.exec(["sh", "-c", "echo hi"])
            big = await sandbox.exec(["python3", "-c", "print('x' * 3000000)"], stdin=b"y" * 2**20)
    finally:
        loop.set_debug(False)
    assert len(big.stdout) == 3000001
    assert [r.getMessage() for r in caplog.records if "Executing" in r.getMessage()] == []


async def test_linger_stops_reading_after_the_command_exits(sandbox: DockerSandbox) -> None:
    """Output within the grace still counts; a job holding the pipes past it is not awaited."""
    late = await sandbox.exec(["sh", "-c", "(sleep 0.2; echo late) & echo now"], linger_s=5)
    assert (late.exit_code, late.stdout) == (0, b"now\nlate\n")
    held = await sandbox.exec(
        ["sh", "-c", "sleep 1014 & echo now; exit 2"], linger_s=0.2, timeout_s=60
    )
    assert (held.exit_code, held.stdout, held.timed_out) == (2, b"now\n", False)
    await sandbox.exec(["pkill", "-f", "sleep 1014"])


async def test_calls_to_one_shell_session_take_turns(sandbox: DockerSandbox) -> None:
    async def call(command: str) -> bytes:
        done = await sandbox.shell("turns", command, workdir="/testbed", timeout_s=30)
        assert done is not None
        return done.stdout

    first, second = await asyncio.gather(
        call("cd /tmp; sleep 0.3; echo first"), call("echo second; pwd")
    )
    assert (first, second) == (b"first\n", b"second\n/tmp\n")
