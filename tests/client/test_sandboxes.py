"""The client's sandboxes (sync and async) against a real Sandhive: commands, files, TTL, log.

`sandhive serve` and a `sandhive worker` run as subprocesses with API keys on; every call
goes over HTTP as a user's harness would make it, and what the client returns is checked
against what the sandbox itself says (a file written is read back by a command, a command
run shows in the sandbox's command log with the key that ran it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from sandhive_client import (
    AsyncSandhive,
    CommandStreamError,
    Conflict,
    ExecOutput,
    ExecResult,
    InvalidInput,
    NotFound,
    Sandbox,
    SandboxFileNotFound,
    SandboxFileTooLarge,
    SandboxIsADirectory,
    SandboxPermissionError,
    Sandhive,
    TooLarge,
)

from app.config import Settings
from app.db.engine import Sessions
from app.services import keys
from tests.e2e.fault_harness import Cluster

FILES_MAX_BYTES = 2**20
"""The server's file size limit here (`sandbox_files_max_bytes`), small enough to cross."""


@pytest.fixture(autouse=True)
def _no_sandbox_left(no_sandbox_left: None) -> None:
    """A test's sandboxes go with it."""


@dataclass(frozen=True)
class Tenants:
    a: str
    a_key_id: str
    b: str


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The client tests' server with API keys on (two tenants), a small file limit, and fast
    heartbeats (a killed worker is noticed within a second or two)."""
    return settings.model_copy(
        update={
            "auth": "keys",
            "sandbox_files_max_bytes": FILES_MAX_BYTES,
            "worker_heartbeat_s": 0.2,
            "worker_lease_s": 1.0,
        }
    )


@pytest.fixture
async def tenants(sessions: Sessions) -> Tenants:
    a = await keys.create_key(sessions, "tenant-a", "harness")
    b = await keys.create_key(sessions, "tenant-b", "other")
    return Tenants(a=a.key, a_key_id=a.id, b=b.key)


@pytest.fixture
def client(live: Cluster, tenants: Tenants) -> Iterator[Sandhive]:
    with Sandhive(live.base_url, api_key=tenants.a) as sandhive:
        yield sandhive


def seconds_from_now(when: datetime) -> float:
    return (when - datetime.now(UTC)).total_seconds()


def test_commands_run_as_argv_or_shell_with_stdin_env_cwd_and_timeout(
    client: Sandhive, tenants: Tenants
) -> None:
    with client.sandboxes.create(ttl_s=300, metadata={"suite": "client"}, env={"A": "one"}) as sb:
        assert (sb.info.status, sb.info.metadata) == ("running", {"suite": "client"})
        assert sb.id.startswith("sbx_")
        workdir = sb.info.workdir

        result = sb.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
        assert isinstance(result, ExecResult)
        assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
        assert not result.ok
        assert not result.timed_out

        shell = sb.exec('echo "$A $B" | tr a-z A-Z', env={"B": "two"})
        assert (shell.exit_code, shell.stdout_text) == (0, "ONE TWO\n")

        raw = b"\x00\xff\xc3\x28 not utf-8\n"
        echoed = sb.exec(["cat"], stdin=raw)
        assert echoed.stdout == raw  # bytes in and out, exactly
        assert sb.exec(["wc", "-c"], stdin="héllo").stdout_text.strip() == "6"

        assert sb.exec(["pwd"]).stdout_text == f"{workdir}\n"
        sb.exec(["mkdir", "-p", "sub/dir"])
        assert sb.exec(["pwd"], cwd="sub/dir").stdout_text == f"{workdir}/sub/dir\n"
        assert sb.exec(["pwd"], cwd="/tmp").stdout_text == "/tmp\n"

        nobody = sb.exec(["id", "-un"], user="nobody")
        assert nobody.stdout_text == "nobody\n"
        refused = sb.exec(["/etc/passwd"])
        assert refused.exit_code == 126
        assert "permission denied" in refused.stderr_text.lower()

        started = time.monotonic()
        slow = sb.exec(["sh", "-c", "echo begun; sleep 30"], timeout_s=1)
        assert (slow.timed_out, slow.exit_code) == (True, None)
        assert time.monotonic() - started < 20
        assert slow.stdout == b"begun\n"

        truncated = sb.exec(["head", "-c", "5000", "/dev/zero"], max_output_bytes=100)
        assert (len(truncated.stdout), truncated.stdout_truncated) == (100, True)

        log = sb.commands().items
        assert [c.seq for c in log] == list(range(1, len(log) + 1))
        assert log[0].argv == ["sh", "-c", "echo out; echo err >&2; exit 3"]
        assert (log[0].exit_code, log[0].command) == (3, None)
        assert log[1].command == 'echo "$A $B" | tr a-z A-Z'
        assert [c.user for c in log if c.argv == ["id", "-un"]] == ["nobody"]
        assert [(c.timed_out, c.exit_code) for c in log if c.timed_out] == [(True, None)]
        assert {c.key_id for c in log} == {tenants.a_key_id}
        assert sb.refresh().commands == len(log)
    assert sb.info.status == "ended"


def test_files_round_trip_and_fail_as_python_does(client: Sandhive) -> None:
    with client.sandboxes.create(ttl_s=300) as sb:
        workdir = sb.info.workdir
        blob = bytes(range(256)) * 4
        written = sb.files.write("data/blob.bin", blob)
        assert (written.path, written.size) == (f"{workdir}/data/blob.bin", len(blob))
        assert sb.files.read("data/blob.bin") == blob
        assert sb.exec(["sha256sum", "data/blob.bin"]).ok  # the sandbox sees the same file
        assert sb.exec(["wc", "-c", "data/blob.bin"]).stdout_text.split()[0] == str(len(blob))

        sb.files.write("/tmp/notes.txt", "héllo\r\nwörld")
        assert sb.files.read("/tmp/notes.txt") == "héllo\r\nwörld".encode()
        sb.files.write("/tmp/notes.txt", "")
        assert sb.files.read("/tmp/notes.txt") == b""

        listed = sb.files.list("data")
        assert listed.path == f"{workdir}/data"
        assert [(e.name, e.type, e.size) for e in listed.entries] == [
            ("blob.bin", "file", len(blob))
        ]
        assert "data" in [e.name for e in sb.files.list().entries]  # the workdir

        with pytest.raises(SandboxFileNotFound) as missing:
            sb.files.read("nowhere/missing.txt")
        assert isinstance(missing.value, FileNotFoundError)
        assert isinstance(missing.value, NotFound)
        assert "missing.txt" in str(missing.value)
        assert missing.value.details["reason"] == "missing"

        with pytest.raises(IsADirectoryError) as directory:
            sb.files.read("data")
        assert isinstance(directory.value, SandboxIsADirectory)
        assert isinstance(directory.value, InvalidInput)
        assert "data" in str(directory.value)
        with pytest.raises(SandboxIsADirectory):
            sb.files.write("data", b"onto a directory")

        sb.files.write("secret.txt", "locked")
        assert sb.exec(["chmod", "000", "secret.txt"]).ok
        with pytest.raises(PermissionError) as forbidden:
            sb.files.read("secret.txt")
        assert isinstance(forbidden.value, SandboxPermissionError)
        assert forbidden.value.status == 403
        assert "secret.txt" in str(forbidden.value)

        with pytest.raises(SandboxFileTooLarge) as too_large:
            sb.files.write("big.bin", b"x" * (FILES_MAX_BYTES + 1))
        assert isinstance(too_large.value, TooLarge)
        assert too_large.value.status == 413
        assert sb.exec(["test", "-e", "big.bin"]).exit_code == 1  # nothing was written


def test_exec_stream_yields_output_while_the_command_runs(client: Sandhive) -> None:
    with client.sandboxes.create(ttl_s=300) as sb:
        started = time.monotonic()
        seen: list[tuple[float, ExecOutput | ExecResult]] = []
        for item in sb.exec_stream("echo first; sleep 3; echo second >&2; exit 4"):
            seen.append((time.monotonic() - started, item))
        pieces = [item for _, item in seen[:-1]]
        last_at, result = seen[-1]
        assert all(isinstance(p, ExecOutput) for p in pieces)
        assert isinstance(result, ExecResult)
        first_at = next(at for at, item in seen if isinstance(item, ExecOutput))
        assert last_at - first_at >= 2.5, seen  # "first" came while it was still sleeping
        by_stream = {
            s: b"".join(p.data for p in pieces if isinstance(p, ExecOutput) and p.stream == s)
            for s in ("stdout", "stderr")
        }
        assert by_stream == {"stdout": b"first\n", "stderr": b"second\n"}
        assert (result.exit_code, result.stdout, result.stderr) == (4, b"first\n", b"second\n")
        assert sb.commands().items[-1].command == "echo first; sleep 3; echo second >&2; exit 4"


def test_a_stream_its_worker_loses_ends_in_command_stream_error(
    client: Sandhive, live: Cluster
) -> None:
    sb = client.sandboxes.create(ttl_s=300)
    stream = sb.exec_stream("echo started; sleep 60")
    first = next(stream)
    assert isinstance(first, ExecOutput)
    assert first.data == b"started\n"
    (worker,) = [p for p in live.procs if "worker" in p.args]
    worker.kill()  # SIGKILL: no goodbye, its sandbox and the command with it
    worker.wait()
    started = time.monotonic()
    with pytest.raises(CommandStreamError) as broke:
        next(stream)
    assert time.monotonic() - started < 30
    assert broke.value.code == "unavailable"
    assert sb.id in str(broke.value)
    assert sb.refresh().end_reason == "worker_lost"


def test_ttl_list_delete_and_tenants(client: Sandhive, live: Cluster, tenants: Tenants) -> None:
    sb = client.sandboxes.create(ttl_s=120, metadata={"suite": "ttl"})
    assert 60 < seconds_from_now(sb.info.expires_at) <= 125
    before = sb.info.expires_at
    moved = sb.set_ttl(3600)
    assert moved.expires_at > before
    assert 3500 < seconds_from_now(moved.expires_at) <= 3605
    assert sb.info == moved
    with pytest.raises(InvalidInput):
        sb.set_ttl(10**9)  # past the server's lifetime cap

    running = client.sandboxes.list(status="running")
    assert sb.id in [info.id for info in running.items]
    assert client.sandboxes.get(sb.id).info.expires_at == moved.expires_at

    with Sandhive(live.base_url, api_key=tenants.b) as other:
        with pytest.raises(NotFound) as hidden:
            other.sandboxes.get(sb.id)
        assert not isinstance(hidden.value, SandboxFileNotFound)
        as_other = Sandbox(other, sb.info)
        with pytest.raises(NotFound):
            as_other.exec(["true"])
        with pytest.raises(NotFound):
            as_other.files.read("anything")
        with pytest.raises(NotFound):
            as_other.delete()
        assert sb.id not in [i.id for i in other.sandboxes.list().items]

    ended = sb.delete()
    assert (ended.status, ended.end_reason) == ("ended", "deleted")
    assert ended.ended_at is not None
    assert sb.delete().status == "ended"  # idempotent
    with pytest.raises(Conflict):
        sb.exec(["true"])
    assert sb.id in [i.id for i in client.sandboxes.list(status="ended").items]
    assert sb.id not in [i.id for i in client.sandboxes.list(status="running").items]
    with pytest.raises(NotFound):
        client.sandboxes.get("sbx_01JD8Z6V0Q5W3M9B2C7K4T1R8E")


async def test_async_client_drives_a_sandbox(live: Cluster, tenants: Tenants) -> None:
    async with AsyncSandhive(live.base_url, api_key=tenants.a) as client:
        sb = await client.sandboxes.create(ttl_s=300, env={"WHO": "async"})
        async with sb:
            result = await sb.exec(["sh", "-c", 'printf "%s" "$WHO"; exit 2'])
            assert (result.exit_code, result.stdout_text) == (2, "async")
            assert (await sb.exec("cat", stdin=b"\x00\x01")).stdout == b"\x00\x01"

            pieces: list[ExecOutput] = []
            final: ExecResult | None = None
            async for item in sb.exec_stream(["sh", "-c", "echo a; sleep 1; echo b"]):
                if isinstance(item, ExecOutput):
                    pieces.append(item)
                else:
                    final = item
            assert final is not None
            assert final.stdout == b"a\nb\n"
            assert b"".join(p.data for p in pieces) == b"a\nb\n"

            await sb.files.write("in/x.bin", b"\xc3\x28")
            assert await sb.files.read("in/x.bin") == b"\xc3\x28"
            assert [e.name for e in (await sb.files.list("in")).entries] == ["x.bin"]
            with pytest.raises(FileNotFoundError):
                await sb.files.read("in/y.bin")
            with pytest.raises(IsADirectoryError):
                await sb.files.read("in")

            timed = await sb.exec(["sleep", "20"], timeout_s=1)
            assert timed.timed_out
            assert timed.exit_code is None
            moved = await sb.set_ttl(1800)
            assert 1700 < seconds_from_now(moved.expires_at) <= 1805
            log = (await sb.commands()).items
            assert [c.argv or c.command for c in log][:2] == [
                ["sh", "-c", 'printf "%s" "$WHO"; exit 2'],
                "cat",
            ]
            assert (await sb.refresh()).commands == len(log)
            assert sb.id in [i.id for i in (await client.sandboxes.list(status="running")).items]
        assert sb.info.status == "ended"
        with pytest.raises(Conflict):
            await sb.exec(["true"])
        again = await client.sandboxes.get(sb.id)
        assert again.info.end_reason == "deleted"
