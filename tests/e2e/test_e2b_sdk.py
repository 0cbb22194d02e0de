"""The official `e2b` SDK (pinned in the `e2b` extra), pointed at a live Sandhive (`sandhive
serve` + `sandhive worker` subprocesses, API keys on) by its documented environment
variables only: sandboxes made, listed, given a timeout and killed; commands run (waited
for, streamed, in the background and killed, listed); files written and read as text and
bytes, listed, stat'ed, moved and removed. Another tenant's sandbox is the SDK's own
not-found, and what this server does not do is the SDK's error, never a hang."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import (
    CommandExitException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxQuery,
)

from app.config import Settings
from tests.support.processes import Service, api_key, keyed_service


@pytest.fixture
def service(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    with keyed_service(settings, tmp_path) as svc:
        yield svc


def key_for(settings: Settings, tenant: str, cwd: Path) -> str:
    return api_key(settings.model_copy(update={"auth": "keys"}), tenant, cwd)


def point_sdk_at(monkeypatch: pytest.MonkeyPatch, service: Service, key: str) -> None:
    monkeypatch.setenv("E2B_API_URL", f"{service.base_url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{service.base_url}/e2b/envd")
    monkeypatch.setenv("E2B_API_KEY", key)
    monkeypatch.setenv("E2B_HTTP_VERSION", "1.1")


def test_the_e2b_sdk_drives_sandhive_sandboxes(
    service: Service, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, bob = key_for(settings, "alice", tmp_path), key_for(settings, "bob", tmp_path)
    point_sdk_at(monkeypatch, service, alice)

    sandbox = Sandbox.create(timeout=120, metadata={"run": "e2b test@1"}, envs={"GREETING": "hi"})
    try:
        # Commands: waited for, streamed, failing, in the background and killed.
        done = sandbox.commands.run("echo $GREETING from $(whoami); echo oops >&2")
        assert (done.exit_code, done.stdout, done.stderr) == (0, "hi from root\n", "oops\n")
        seen: list[str] = []
        sandbox.commands.run("for i in 1 2 3; do echo $i; sleep 0.2; done", on_stdout=seen.append)
        assert "".join(seen) == "1\n2\n3\n"
        with pytest.raises(CommandExitException) as failed:
            sandbox.commands.run("exit 3")
        assert failed.value.exit_code == 3
        background = sandbox.commands.run("sleep 300", background=True)
        listed = {p.pid: p for p in sandbox.commands.list()}
        assert background.pid in listed, listed
        assert sandbox.commands.kill(background.pid)
        with pytest.raises(CommandExitException):
            background.wait()
        assert background.pid not in {p.pid for p in sandbox.commands.list()}
        assert not sandbox.commands.kill(background.pid), "a pid that no longer runs"
        # Input sent to a running command, then its end (EOF).
        reader = sandbox.commands.run("read line; echo got:$line", background=True, stdin=True)
        sandbox.commands.send_stdin(reader.pid, "hello\n")
        assert reader.wait().stdout == "got:hello\n"
        cat = sandbox.commands.run("cat", background=True, stdin=True)
        sandbox.commands.send_stdin(cat.pid, "a")
        sandbox.commands.send_stdin(cat.pid, b"b\n")
        sandbox.commands.close_stdin(cat.pid)
        assert cat.wait().stdout == "ab\n"
        with pytest.raises(NotFoundException):
            sandbox.commands.send_stdin(cat.pid, "too late")

        # Files: text and bytes, listed, stat'ed, moved, removed.
        sandbox.files.write("/tmp/e2b/hello.txt", "hello from the SDK\n")
        sandbox.files.write("/tmp/e2b/blob.bin", bytes(range(256)))
        assert sandbox.files.read("/tmp/e2b/hello.txt") == "hello from the SDK\n"
        assert bytes(sandbox.files.read("/tmp/e2b/blob.bin", format="bytes")) == bytes(range(256))
        names = sorted(entry.name for entry in sandbox.files.list("/tmp/e2b"))
        assert names == ["blob.bin", "hello.txt"]
        assert sandbox.files.exists("/tmp/e2b/hello.txt")
        assert not sandbox.files.exists("/tmp/e2b/nope")
        info = sandbox.files.get_info("/tmp/e2b/blob.bin")
        assert (info.size, info.type.value if info.type else None) == (256, "file")
        assert sandbox.files.make_dir("/tmp/e2b/sub")
        assert not sandbox.files.make_dir("/tmp/e2b/sub"), "made already"
        sandbox.files.rename("/tmp/e2b/hello.txt", "/tmp/e2b/sub/moved.txt")
        assert sandbox.commands.run("cat /tmp/e2b/sub/moved.txt").stdout == "hello from the SDK\n"
        sandbox.files.remove("/tmp/e2b/sub")
        assert not sandbox.files.exists("/tmp/e2b/sub")

        # The control plane: listed by metadata, a new timeout, connected to by id.
        listed_ids = [info.sandbox_id for info in Sandbox.list().next_items()]
        assert sandbox.sandbox_id in listed_ids
        running = Sandbox.list(query=SandboxQuery(metadata={"run": "e2b test@1"})).next_items()
        assert [info.sandbox_id for info in running] == [sandbox.sandbox_id]
        sandbox.set_timeout(60)
        described = sandbox.get_info()
        assert (described.sandbox_id, described.metadata) == (
            sandbox.sandbox_id,
            {"run": "e2b test@1"},
        )
        assert described.template_id == "default"
        again = Sandbox.connect(sandbox.sandbox_id)
        assert again.commands.run("echo again").stdout == "again\n"

        # Another tenant's key: the SDK's not-found, for the control plane and envd alike.
        monkeypatch.setenv("E2B_API_KEY", bob)
        with pytest.raises(NotFoundException):
            Sandbox.connect(sandbox.sandbox_id)
        assert not Sandbox.kill(sandbox.sandbox_id), "not bob's to kill"
        monkeypatch.setenv("E2B_API_KEY", alice)
        envd = f"{service.base_url}/e2b/envd/files"
        asked = {"path": "/tmp/e2b/blob.bin"}
        as_bob = {"X-Access-Token": bob, "E2b-Sandbox-Id": sandbox.sandbox_id}
        refused = httpx.get(envd, params=asked, headers=as_bob)
        assert refused.status_code == 502, refused.text  # envd's proxy: no such sandbox
        assert f"sandbox {sandbox.sandbox_id} was not found" in refused.json()["message"]
        as_alice = {**as_bob, "X-Access-Token": alice}
        assert httpx.get(envd, params=asked, headers=as_alice).content == bytes(range(256))

        # What this server does not do is an error, never a hang.
        with pytest.raises(SandboxException, match="not supported"):
            sandbox.pause()
    finally:
        sandbox.kill()

    # Killed: gone for the SDK, ended in Sandhive's own API, every command in its audit log.
    assert not sandbox.is_running()
    assert not Sandbox.kill(sandbox.sandbox_id)
    own = {"Authorization": f"Bearer {alice}"}
    box = httpx.get(f"{service.base_url}/v1/sandboxes/{sandbox.sandbox_id}", headers=own).json()
    assert (box["status"], box["end_reason"], box["metadata"]) == (
        "ended",
        "deleted",
        {"run": "e2b test@1"},
    )
    log = httpx.get(
        f"{service.base_url}/v1/sandboxes/{sandbox.sandbox_id}/commands", headers=own
    ).json()["items"]
    ran = [entry["argv"] for entry in log if entry.get("argv")]
    assert ["/bin/bash", "-l", "-c", "sleep 300"] in ran, ran
    with pytest.raises(NotFoundException):
        Sandbox.connect(sandbox.sandbox_id)
    with pytest.raises(SandboxException, match="404: template 'no-such-template' not found"):
        Sandbox.create(template="no-such-template")  # the SDK's error for a template
    assert sandbox.sandbox_id not in [i.sandbox_id for i in Sandbox.list().next_items()]
