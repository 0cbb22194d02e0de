"""`/v1/sandboxes` end to end: a real worker process, real containers."""

from __future__ import annotations

import base64
from datetime import datetime

import httpx

from tests.sandboxes.conftest import ALICE, BOB, create, run
from tests.support.zygote import AppProcess


async def test_a_sandbox_runs_commands_and_moves_files(
    api: httpx.AsyncClient, worker: AppProcess
) -> None:
    made = await create(api, ttl_s=120, metadata={"suite": "smoke"}, env={"GREETING": "hi"})
    assert made["status"] == "running"
    assert made["workdir"] == "/testbed"
    sid = made["id"]

    done = await run(api, sid, command="echo $GREETING; echo oops >&2; exit 3")
    assert (done["stdout"], done["stderr"], done["exit_code"]) == ("hi\n", "oops\n", 3)
    done = await run(api, sid, argv=["cat"], stdin="bytes in")
    assert done["stdout"] == "bytes in"
    raw = base64.b64encode(b"\x00\xff\xc3(").decode()
    done = await run(
        api, sid, argv=["cat"], stdin=raw, stdin_encoding="base64", output_encoding="base64"
    )
    assert base64.b64decode(done["stdout"]) == b"\x00\xff\xc3("
    done = await run(api, sid, argv=["pwd"], cwd="sub/..")
    assert done["stdout"] == "/testbed\n"
    done = await run(api, sid, argv=["sh", "-c", "sleep 30 & sleep 30"], timeout_s=1)
    assert (done["timed_out"], done["exit_code"]) == (True, None)
    done = await run(api, sid, command="yes | head -c 100000", max_output_bytes=1000)
    assert len(done["stdout"]) == 1000
    assert done["stdout_truncated"] is True

    url = f"/v1/sandboxes/{sid}/files"
    put = await api.put(url, params={"path": "/tmp/made/x.bin"}, content=b"\x01\x02", headers=ALICE)
    assert put.status_code == 200, put.text
    assert put.json()["path"] == "/tmp/made/x.bin"
    got = await api.get(url, params={"path": "/tmp/made/x.bin"}, headers=ALICE)
    assert got.content == b"\x01\x02"
    # read-only image filesystem by default: the image's own files cannot be changed
    put = await api.put(url, params={"path": "/etc/passwd"}, content=b"x", headers=ALICE)
    assert (put.status_code, put.json()["error"]["details"]["reason"]) == (403, "forbidden")
    assert "root:x:0:0" in (await api.get(url, params={"path": "/etc/passwd"}, headers=ALICE)).text
    for path, status, reason in (
        ("/nope/x", 404, "missing"),
        ("/etc", 422, "is_directory"),
    ):
        got = await api.get(f"/v1/sandboxes/{sid}/files", params={"path": path}, headers=ALICE)
        assert got.status_code == status, got.text
        assert got.json()["error"]["details"]["reason"] == reason
        assert path in got.json()["error"]["message"]
    await run(api, sid, command="echo no > locked; chmod 000 locked")
    got = await api.get(f"/v1/sandboxes/{sid}/files", params={"path": "locked"}, headers=ALICE)
    assert (got.status_code, got.json()["error"]["details"]["reason"]) == (403, "forbidden")

    for method, path, body in (
        ("GET", "", None),
        ("GET", "/commands", None),
        ("GET", "/files/list", None),
        ("POST", "/ttl", {"ttl_s": 60}),
        ("POST", "/exec", {"argv": ["true"]}),
        ("POST", "/exec/stream", {"argv": ["true"]}),
        ("DELETE", "", None),
    ):
        other = await api.request(method, f"/v1/sandboxes/{sid}{path}", json=body, headers=BOB)
        assert other.status_code == 404, (method, path, other.text)
    log = (await api.get(f"/v1/sandboxes/{sid}/commands", headers=ALICE)).json()["items"]
    assert log[0]["command"] == "echo $GREETING; echo oops >&2; exit 3"
    assert log[0]["exit_code"] == 3
    assert log[0]["key_id"]
    assert [entry["seq"] for entry in log] == list(range(1, len(log) + 1))

    extended = await api.post(f"/v1/sandboxes/{sid}/ttl", json={"ttl_s": 250}, headers=ALICE)
    assert extended.status_code == 200, extended.text
    assert datetime.fromisoformat(extended.json()["expires_at"]) > datetime.fromisoformat(
        made["expires_at"]
    )
    gone = await api.delete(f"/v1/sandboxes/{sid}", headers=ALICE)
    assert (gone.json()["status"], gone.json()["end_reason"]) == ("ended", "deleted")
    late = await api.post(f"/v1/sandboxes/{sid}/exec", json={"argv": ["true"]}, headers=ALICE)
    assert late.status_code == 409
