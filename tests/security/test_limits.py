"""Limits on every input (RELIABILITY A-36, A-37, A-40): body size and time, schema bounds,
request rate, browser origins, hostile URLs; every refusal in the contract's error shape."""

from __future__ import annotations

import asyncio
import io
import json
import time
import zipfile
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from app.api.app import create_app
from app.config import Settings
from tests.api.conftest import assert_error, serve
from tests.api.live_server import LiveServer, live_server
from tests.security.conftest import TenantKeys, bearer
from tests.support.settings import plain_settings

MIB = 2**20


def limited(database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "max_json_body_bytes": MIB,
        "max_multipart_body_bytes": 2 * MIB,
        "max_input_total_bytes": MIB,
        "max_input_file_bytes": MIB,
        "request_body_timeout_s": 2.0,
        **overrides,
    }
    return plain_settings(database_url, **values)


@pytest.fixture
async def client(clean_db: str, redis: object) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(create_app(limited(clean_db))) as client:
        yield client


@pytest.fixture
async def live(clean_db: str, redis: object) -> AsyncIterator[LiveServer]:
    async with live_server(limited(clean_db)) as server:
        yield server


# Body size and time


async def test_a_declared_oversized_body_is_refused_before_it_is_sent(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v1/tasks",
        content=b"{}",
        headers={"content-type": "application/json", "content-length": str(50 * MIB)},
    )
    error = assert_error(response, 413, "too_large")
    assert "1048576" in error["message"]


async def test_json_and_multipart_bodies_have_their_own_caps(client: httpx.AsyncClient) -> None:
    big_prompt = {"prompt": "x" * (MIB + 10)}
    assert_error(await client.post("/v1/tasks", json=big_prompt), 413, "too_large")
    # 1.5 MiB of multipart is under its 2 MiB cap (and then over the input cap: 413 too) ...
    files = {"task": (None, '{"prompt": "p"}'), "a.bin": ("a.bin", b"\0" * (3 * MIB // 2))}
    assert_error(await client.post("/v1/tasks", files=files), 413, "too_large")
    # ... 3 MiB is over the body cap itself
    files = {"task": (None, '{"prompt": "p"}'), "a.bin": ("a.bin", b"\0" * (3 * MIB))}
    response = await client.post("/v1/tasks", files=files)
    error = assert_error(response, 413, "too_large")
    assert str(2 * MIB) in error["message"]
    ok = {"task": (None, '{"prompt": "p"}'), "a.bin": ("a.bin", b"\0" * 1000)}
    assert (await client.post("/v1/tasks", files=ok)).status_code == 202


async def test_a_chunked_body_without_length_is_counted_as_it_arrives(
    client: httpx.AsyncClient,
) -> None:
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b'{"prompt": "'
        while sent < 64 * MIB:
            sent += 64 * 1024
            yield b"x" * (64 * 1024)

    response = await client.post(
        "/v1/tasks", content=endless(), headers={"content-type": "application/json"}
    )
    assert_error(response, 413, "too_large")
    assert sent < 2 * MIB  # stopped right after the 1 MiB cap, not at the end of 64 MiB


async def test_over_a_real_socket_413_comes_while_the_client_is_still_sending(
    live: LiveServer,
) -> None:
    """A-36: the answer comes soon after crossing the cap, not after the whole body."""
    host, port = live.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"x" * 65536
    sent = 0
    answer = asyncio.create_task(reader.readline())
    started = time.monotonic()
    try:
        while not answer.done() and sent < 64 * MIB:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            sent += len(chunk)
            await asyncio.sleep(0)
        async with asyncio.timeout(10):
            status_line = await answer
    except (ConnectionError, OSError):
        async with asyncio.timeout(10):
            status_line = await answer
    finally:
        writer.close()
    print(f"413 after {sent / MIB:.1f} MiB sent, {time.monotonic() - started:.2f} s")
    assert status_line.startswith(b"HTTP/1.1 413"), status_line
    assert sent < 32 * MIB  # the cap is 1 MiB; the rest is socket buffers


async def test_a_trickled_body_is_cut_off_by_the_body_timeout(live: LiveServer) -> None:
    host, port = live.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n"
    )
    answer = asyncio.create_task(reader.read(4096))
    started = time.monotonic()
    try:
        while not answer.done() and time.monotonic() - started < 30:
            writer.write(b"          ")  # 10 bytes every 0.2 s: 50 B/s
            await writer.drain()
            await asyncio.sleep(0.2)
        async with asyncio.timeout(5):
            raw = await answer
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), raw
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert time.monotonic() - started < 30  # the 2 s setting, not the client, ended it


async def test_a_body_that_arrives_in_time_is_not_affected_by_the_timeout(
    client: httpx.AsyncClient,
) -> None:
    async def slowish() -> AsyncIterator[bytes]:
        for part in (b'{"prompt": ', b'"fine"}'):
            await asyncio.sleep(0.3)
            yield part

    response = await client.post(
        "/v1/tasks", content=slowish(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 202, response.text


# Schema bounds and input checks


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"prompt": "nul \x00 byte"}, 422),
        ({"prompt": "x" * 300_000}, 422),  # over SANDHIVE_MAX_PROMPT_CHARS
        ({"prompt": "p", "metadata": nested(40)}, 422),
        ({"prompt": "p", "metadata": {f"k{i}": i for i in range(2000)}}, 422),
        ({"prompt": "p", "metadata": {"k\x00": 1}}, 422),
        ({"prompt": "p", "metadata": {"big": "x" * 20_000}}, 422),  # over max_metadata_bytes
        ({"prompt": "p", "llm": {"extra_body": {"max_tokens": 10**9}}}, 422),
        ({"prompt": "p", "llm": {"extra_body": {"messages": []}}}, 422),
        ({"prompt": "p", "llm": {"extra_body": nested(30)}}, 422),
        ({"prompt": "p", "limits": {"max_steps": 10**30}}, 422),
        ({"prompt": "p", "sandbox": {"disk_mb": 10**6}}, 422),
        ({"prompt": "p", "sandbox": {"network": "egress"}}, 422),  # not enabled here
        ({"prompt": "p", "sandbox": {"network": "host"}}, 422),
        ({"prompt": "p", "sandbox": {"privileged": True}}, 422),
        ({"prompt": "p", "input_files": [{"path": "a", "content_base64": "eA=="}] * 5000}, 422),
        ({"prompt": "p", "input_files": [{"path": "a\x00", "content_base64": "eA=="}]}, 422),
        ({"prompt": "p", "input_files": [{"path": "../x", "content_base64": "eA=="}]}, 422),
        ({"prompt": "p", "input_files": [{"path": "/etc/x", "content_base64": "eA=="}]}, 422),
        ({"prompt": "p", "input_files": [{"path": "a" * 4096, "content_base64": ""}]}, 422),
    ],
)
async def test_bad_bodies_get_a_clear_4xx_and_nothing_is_stored(
    client: httpx.AsyncClient, body: dict[str, Any], status: int
) -> None:
    response = await client.post("/v1/tasks", json=body)
    assert_error(response, status, "invalid_input")
    assert (await client.get("/v1/tasks")).json()["items"] == []


async def test_json_nested_beyond_the_parser_is_refused_in_the_error_shape(
    client: httpx.AsyncClient,
) -> None:
    deep = '{"prompt": "p", "metadata": ' + '{"a": ' * 10_000 + "1" + "}" * 10_000 + "}"
    response = await client.post(
        "/v1/tasks", content=deep, headers={"content-type": "application/json"}
    )
    assert response.status_code in (400, 422)
    assert set(response.json()["error"]) == {"code", "message", "details"}


def zip_bomb() -> bytes:
    """A zip whose member inflates 1000x (2 MiB of zeros from about 2 KiB)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("zeros.bin", b"\0" * 2 * MIB)
    return buffer.getvalue()


async def test_an_archive_input_is_stored_as_bytes_never_unpacked(
    client: httpx.AsyncClient,
) -> None:
    bomb = zip_bomb()
    assert len(bomb) < 10_000
    files = {"task": (None, '{"prompt": "p"}'), "data/bomb.zip": ("data/bomb.zip", bomb)}
    response = await client.post("/v1/tasks", files=files)
    assert response.status_code == 202, response.text
    evil = {"task": (None, '{"prompt": "p"}'), "x": ("../../etc/passwd", b"root")}
    assert_error(await client.post("/v1/tasks", files=evil), 422, "invalid_input")


async def test_too_many_files_in_a_multipart_body_is_refused(client: httpx.AsyncClient) -> None:
    files: list[tuple[str, Any]] = [("task", (None, '{"prompt": "p"}'))]
    files += [(f"f{i}", (f"f{i}.txt", b"x")) for i in range(150)]  # max_input_files is 100
    response = await client.post("/v1/tasks", files=files)
    assert response.status_code in (400, 413, 422), response.text
    assert set(response.json()["error"]) == {"code", "message", "details"}


# Hostile URLs


async def test_nul_in_a_url_is_answered_before_the_database_sees_it(
    client: httpx.AsyncClient,
) -> None:
    assert_error(await client.get("/v1/tasks/tsk_%00x"), 404, "not_found")
    assert_error(await client.get("/v1/tasks/tsk_1/artifacts/a%00b"), 404, "not_found")
    assert_error(await client.get("/v1/tasks", params={"cursor": "\x00"}), 422, "invalid_input")


# Request rate


async def test_a_tenant_over_its_rate_gets_429_with_retry_after_and_others_do_not(
    keyed_settings: Settings, tenant_keys: TenantKeys
) -> None:
    settings = keyed_settings.model_copy(update={"rate_limit_per_s": 0.5, "rate_limit_burst": 3})
    async with serve(create_app(settings)) as client:
        a, b = bearer(tenant_keys.a), bearer(tenant_keys.b)
        answers = [(await client.get("/v1/tasks", headers=a)).status_code for _ in range(4)]
        assert answers == [200, 200, 200, 429]
        limited_answer = await client.get("/v1/tasks", headers=a)
        assert_error(limited_answer, 429, "too_many_requests")
        assert 1 <= int(limited_answer.headers["retry-after"]) <= 3
        assert (await client.get("/v1/tasks", headers=b)).status_code == 200


# Browser origins


async def test_foreign_origins_are_refused_and_allowed_ones_get_cors(
    clean_db: str, redis: object
) -> None:
    settings = limited(clean_db, allowed_origins="https://app.example")
    async with serve(create_app(settings)) as client:
        evil = await client.get("/v1/tasks", headers={"Origin": "https://evil.example"})
        assert_error(evil, 403, "forbidden_origin")
        assert "access-control-allow-origin" not in evil.headers
        post = await client.post(
            "/v1/tasks", json={"prompt": "p"}, headers={"Origin": "https://evil.example"}
        )
        assert_error(post, 403, "forbidden_origin")
        ok = await client.get("/v1/tasks", headers={"Origin": "https://app.example"})
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == "https://app.example"
        preflight = await client.options(
            "/v1/tasks",
            headers={
                "Origin": "https://app.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert preflight.status_code == 200
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        same = await client.get("/v1/tasks", headers={"Origin": "http://sandhive.test"})
        assert same.status_code == 200  # the page at / calling its own API
        plain = await client.get("/v1/tasks")  # no Origin: not a browser, keys decide
        assert plain.status_code == 200


async def test_without_an_allow_list_only_the_own_origin_passes(client: httpx.AsyncClient) -> None:
    assert_error(
        await client.get("/v1/tasks", headers={"Origin": "http://localhost:3000"}),
        403,
        "forbidden_origin",
    )
    assert (await client.get("/healthz", headers={"Origin": "http://sandhive.test"})).is_success


def test_settings_read_lists_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDHIVE_ALLOWED_ORIGINS", "https://a.example, https://b.example")
    monkeypatch.setenv("SANDHIVE_SANDBOX_EGRESS_ALLOW", '["192.0.2.0/24"]')
    settings = Settings(_env_file=None)
    assert settings.allowed_origins == ["https://a.example", "https://b.example"]
    assert settings.sandbox_egress_allow == ["192.0.2.0/24"]


@pytest.mark.parametrize("entry", ["example.com", "2001:db8::/32", "10.0.0.0/33", "0.0.0.0/0"])
def test_an_egress_allow_list_of_names_or_ipv6_is_refused_at_start_up(
    monkeypatch: pytest.MonkeyPatch, entry: str
) -> None:
    monkeypatch.setenv("SANDHIVE_SANDBOX_EGRESS_ALLOW", f"192.0.2.0/24,{entry}")
    with pytest.raises(ValidationError, match="sandbox_egress_allow") as refused:
        Settings(_env_file=None)
    assert entry in str(refused.value)
