"""DockerHost and DockerSandbox against the real Docker daemon and the real sandbox image."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from app.errors import SandboxError
from app.sandbox import CollectCaps, CollectedFile, DockerHost, DockerSandbox, SandboxConfig
from tests.sandbox.conftest import MakeSandbox

# CHOWN(0) DAC_OVERRIDE(1) FOWNER(3) FSETID(4) KILL(5) SETGID(6) SETUID(7)
EXPECTED_CAPS = "00000000000000fb"
CAPS = CollectCaps(max_files=100, max_file_bytes=1000, max_total_bytes=100_000)


async def sh(sandbox: DockerSandbox, script: str, **kwargs: object) -> str:
    """Run a shell script that must succeed; its stdout as text."""
    result = await sandbox.exec(["sh", "-c", script], **kwargs)  # type: ignore[arg-type]
    assert result.exit_code == 0, result.stderr
    return result.stdout.decode()


async def test_ping_and_has_image(host: DockerHost, docker_image: str) -> None:
    await host.ping()
    assert await host.has_image(docker_image)
    assert not await host.has_image("sandhive-no-such-image:nope")


async def test_ping_fails_cleanly_without_a_daemon() -> None:
    async with DockerHost("unix:///nonexistent/docker.sock") as nowhere:
        with pytest.raises(SandboxError, match="did not answer"):
            await nowhere.ping()


async def test_create_sets_up_the_workdir(sandbox: DockerSandbox) -> None:
    out = await sh(sandbox, "pwd; ls -A; git rev-parse --is-inside-work-tree")
    assert out.split() == ["/testbed", ".git", "input", "output", "true"]


async def test_created_container_carries_labels_and_policy(
    host: DockerHost, sandbox: DockerSandbox, test_labels: dict[str, str]
) -> None:
    assert await host.list_sandboxes(test_labels) == [sandbox.id]
    assert await host.list_sandboxes({"sandhive.task": "tsk_test"}) != []
    info = await host.api().containers.container(sandbox.id).show()
    assert info["Config"]["Labels"] == {**test_labels, "sandhive.managed": "1"}
    hc = info["HostConfig"]
    assert hc["CapDrop"] == ["ALL"]
    assert hc["NetworkMode"] == "none"
    assert hc["Init"] is True
    assert hc["Privileged"] is False
    assert hc["SecurityOpt"] == ["no-new-privileges"]
    assert hc["PidsLimit"] == 512
    # memory_mb plus the RAM-backed /testbed (disk_mb, 1024 by default)
    assert hc["Memory"] == hc["MemorySwap"] == (512 + 1024) * 2**20
    assert hc["ReadonlyRootfs"] is True


async def test_sandbox_runs_without_the_dropped_capabilities(sandbox: DockerSandbox) -> None:
    status = dict(
        line.split(":\t", 1) for line in (await sh(sandbox, "cat /proc/self/status")).splitlines()
    )
    assert status["CapEff"] == EXPECTED_CAPS
    assert status["CapBnd"] == EXPECTED_CAPS
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"
    raw = await sandbox.exec(
        ["python3", "-c", "import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)"]
    )
    assert raw.exit_code != 0
    assert b"PermissionError" in raw.stderr
    node = await sandbox.exec(["mknod", "/tmp/dev", "c", "1", "3"])
    assert node.exit_code != 0
    mount = await sandbox.exec(["mount", "-t", "tmpfs", "none", "/mnt"])
    assert mount.exit_code != 0
    # ...while root still works normally in its own files
    await sh(sandbox, "touch f && chmod 0400 f && echo x >> f && chown 1000:1000 f && rm f")


async def test_network_none_has_only_loopback(sandbox: DockerSandbox) -> None:
    assert (await sh(sandbox, "ls /sys/class/net")).split() == ["lo"]


async def test_exec_keeps_stdout_stderr_and_exit_code_apart(sandbox: DockerSandbox) -> None:
    result = await sandbox.exec(["sh", "-c", "echo out; echo err >&2; echo out2; exit 3"])
    assert result.exit_code == 3
    assert result.stdout == b"out\nout2\n"
    assert result.stderr == b"err\n"
    assert result.timed_out is False


async def test_exec_workdir_and_env(sandbox: DockerSandbox) -> None:
    assert await sh(sandbox, "pwd") == "/testbed\n"
    assert await sh(sandbox, "pwd", workdir="/tmp") == "/tmp\n"
    out = await sh(sandbox, 'echo "$FOO|$LANG|$PATH"', env={"FOO": "bar baz"})
    foo, lang, path = out.strip().split("|")
    assert (foo, lang) == ("bar baz", "C.UTF-8")
    assert "/root/.local/bin" in path.split(":")


async def test_config_env_reaches_every_exec(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox(env={"TASK_HINT": "42"})
    assert await sh(sandbox, 'echo "$TASK_HINT"') == "42\n"


async def test_stdin_of_20_mb_arrives_intact(sandbox: DockerSandbox) -> None:
    payload = os.urandom(20 * 2**20)
    result = await sandbox.exec(["sha256sum"], stdin=payload, timeout_s=60)
    assert result.exit_code == 0
    assert result.stdout.split()[0].decode() == hashlib.sha256(payload).hexdigest()


async def test_empty_stdin_delivers_eof(sandbox: DockerSandbox) -> None:
    result = await sandbox.exec(["wc", "-c"], stdin=b"", timeout_s=10)
    assert (result.exit_code, result.stdout.strip(), result.timed_out) == (0, b"0", False)


async def test_stdin_not_read_to_the_end_is_fine(sandbox: DockerSandbox) -> None:
    result = await sandbox.exec(["head", "-c", "5"], stdin=b"abcdefgh" * 2**19, timeout_s=20)
    assert (result.exit_code, result.stdout, result.timed_out) == (0, b"abcde", False)


async def test_on_output_receives_chunks_as_they_come(sandbox: DockerSandbox) -> None:
    seen: list[tuple[float, str, bytes]] = []

    async def on_output(stream: str, chunk: bytes) -> None:
        seen.append((time.monotonic(), stream, chunk))

    result = await sandbox.exec(["sh", "-c", "echo a; sleep 1; echo b >&2"], on_output=on_output)
    ended = time.monotonic()
    assert result.stdout == b"a\n"
    assert result.stderr == b"b\n"
    assert [(stream, chunk) for _, stream, chunk in seen] == [
        ("stdout", b"a\n"),
        ("stderr", b"b\n"),
    ]
    assert ended - seen[0][0] > 0.7


async def test_timeout_returns_partial_output_and_kills_the_process_tree(
    sandbox: DockerSandbox,
) -> None:
    started = time.monotonic()
    script = 'trap "" TERM; echo started; sleep 4321 & sleep 4322; echo never'
    result = await sandbox.exec(["sh", "-c", script], timeout_s=1.0)
    assert time.monotonic() - started < 30  # liveness only: far below the 4322 s sleep
    assert result.timed_out is True
    assert result.exit_code == -1
    assert result.stdout == b"started\n"
    procs = await sh(sandbox, "ps -eo args")
    assert "sleep 432" not in procs
    assert (await sandbox.exec(["true"])).exit_code == 0  # still usable


async def test_output_flood_is_capped(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox(output_cap_bytes=4096)
    result = await sandbox.exec(["sh", "-c", "seq 1 200000"], timeout_s=30)
    assert result.exit_code == 0
    assert result.stdout.startswith(b"1\n2\n3\n")
    assert result.stdout.endswith(b"199999\n200000\n")
    assert b"bytes of output dropped" in result.stdout
    assert len(result.stdout) < 4200


async def test_put_files_round_trip(sandbox: DockerSandbox) -> None:
    binary = bytes(range(256)) * 1000
    files = [("a.txt", b"hello\n"), ("nested/deeper/b.bin", binary), ("nested/c", b"")]
    await sandbox.put_files("/testbed/input/new", files)
    for path, content in files:
        result = await sandbox.exec(["cat", f"/testbed/input/new/{path}"])
        assert result.stdout == content
    listing = await sh(sandbox, "cd /testbed/input/new && find . -type f | sort")
    assert listing.split() == ["./a.txt", "./nested/c", "./nested/deeper/b.bin"]


async def test_put_files_without_the_channel_uses_the_archive_api(
    docker_image: str, test_labels: dict[str, str]
) -> None:
    async with DockerHost(exec_channel=False) as host:
        box = await host.create_sandbox(
            SandboxConfig(image=docker_image, labels=test_labels, memory_mb=512)
        )
        try:
            await box.put_files("/testbed/input", [("d/a.txt", b"direct\n")])
            assert (await box.exec(["cat", "/testbed/input/d/a.txt"])).stdout == b"direct\n"
        finally:
            await box.remove()


async def test_put_files_large_and_failing(sandbox: DockerSandbox) -> None:
    big = bytes(range(256)) * (32 * 2**12)  # 32 MiB through the channel in one frame
    await sandbox.put_files("/testbed/input", [("big.bin", big)])
    assert await sh(sandbox, "wc -c < /testbed/input/big.bin") == f"{len(big)}\n"
    with pytest.raises(SandboxError, match="cannot copy files to /usr/x"):
        await sandbox.put_files("/usr/x", [("a.txt", b"1")])  # the image is read-only


@pytest.mark.parametrize("name", ["../x", "/etc/x", "a//b"])
async def test_put_files_rejects_unsafe_names(sandbox: DockerSandbox, name: str) -> None:
    with pytest.raises(ValueError, match="invalid relative path"):
        await sandbox.put_files("/testbed/input", [("fine.txt", b"1"), (name, b"2")])
    assert await sh(sandbox, "ls -A /testbed/input; ls /testbed/x /x 2>/dev/null; true") == ""


async def test_collect_returns_regular_files_and_skips_the_rest(sandbox: DockerSandbox) -> None:
    await sandbox.put_files("/testbed/output", [("bin.dat", bytes(range(256)))])
    await sh(
        sandbox,
        "cd /testbed/output && printf answer > answer.txt && mkdir -p sub/deep"
        " && printf '\\000\\001' > sub/deep/z && ln -s /etc/passwd passwd"
        " && head -c 5000 /dev/zero > big && mkfifo pipe && ln answer.txt hard",
    )
    got = await sandbox.collect("/testbed/output", CAPS)
    assert sorted(got.files, key=lambda f: f.path) == [
        CollectedFile("answer.txt", b"answer"),
        CollectedFile("bin.dat", bytes(range(256))),
        CollectedFile("sub/deep/z", b"\x00\x01"),
    ]
    assert sorted(got.skipped) == [
        ("big", "too large"),
        ("hard", "hardlink"),
        ("passwd", "symlink"),
        ("pipe", "fifo"),
    ]


async def test_collect_stops_at_max_files(sandbox: DockerSandbox) -> None:
    await sh(sandbox, "cd /testbed/output && for i in 1 2 3 4 5; do echo $i > f$i; done")
    caps = CollectCaps(max_files=3, max_file_bytes=100, max_total_bytes=1000)
    got = await sandbox.collect("/testbed/output/", caps)
    assert [f.path for f in got.files] == ["f1", "f2", "f3"]
    assert got.skipped == [("f4", "file limit reached")]


async def test_collect_missing_dir_is_empty(sandbox: DockerSandbox) -> None:
    got = await sandbox.collect("/testbed/nope", CAPS)
    assert (got.files, got.skipped) == ([], [])


async def test_collect_a_symlinked_source_returns_nothing(sandbox: DockerSandbox) -> None:
    await sh(sandbox, "rm -rf /testbed/output && ln -s /etc /testbed/output")
    got = await sandbox.collect("/testbed/output", CAPS)
    assert got.files == []
    assert got.skipped == [("output", "symlink")]


async def test_remove_is_idempotent_and_leaves_nothing(
    host: DockerHost, sandbox: DockerSandbox, test_labels: dict[str, str]
) -> None:
    await sandbox.remove()
    await sandbox.remove()
    await host.remove_container(sandbox.id)
    assert await host.list_sandboxes(test_labels) == []
    with pytest.raises(SandboxError):
        await sandbox.exec(["true"])
    with pytest.raises(SandboxError):
        await sandbox.collect("/testbed/output", CAPS)


async def test_failed_create_leaves_no_container(
    host: DockerHost, test_labels: dict[str, str]
) -> None:
    config = SandboxConfig(image="sandhive-no-such-image:nope", labels=test_labels)
    with pytest.raises(SandboxError, match="No such image"):
        await host.create_sandbox(config)
    assert await host.list_sandboxes(test_labels) == []


async def test_failed_setup_removes_the_container(
    host: DockerHost, docker_image: str, test_labels: dict[str, str]
) -> None:
    config = SandboxConfig(image=docker_image, labels=test_labels, workdir="/proc/sandhive")
    with pytest.raises(SandboxError):
        await host.create_sandbox(config)
    assert await host.list_sandboxes(test_labels) == []
