"""The proxy's refusals over real sockets on loopback, without Docker (fast, each path alone).

The grant's key is 127.0.0.1 (the address the test connects to), so the proxy treats the
test as a task; every upstream here would be loopback, which the proxy never reaches, so
these tests cover refusals only (what is allowed is shown from a sandbox in
test_egress_proxy.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.egress import rules
from app.egress.control import Control
from app.egress.proxy import Grant, Proxy

Reports = list[tuple[str, str]]


@pytest.fixture
async def proxy() -> AsyncIterator[tuple[Proxy, int, Reports]]:
    reports: Reports = []
    proxy = Proxy(lambda _grant, host, reason: reports.append((host, reason)))
    proxy.grants["127.0.0.1"] = Grant(
        key="127.0.0.1",
        task="tsk_local",
        attempt=1,
        allow=("good.test", "loop.test"),
        max_connections=5,
        max_bytes=10_000,
        ports=frozenset({80, 443}),
        hosts={"good.test": "203.0.113.9", "loop.test": "127.0.0.1"},
        exempt=rules.parse_networks(["203.0.113.0/24"]),  # TEST-NET-3: never connected to
        max_open=3,
    )
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield proxy, port, reports


async def ask(port: int, head: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(4096), 10)
    writer.close()
    return answer


async def test_names_raw_ips_ports_and_forged_hosts_are_refused(
    proxy: tuple[Proxy, int, Reports],
) -> None:
    _, port, reports = proxy
    cases = {
        b"GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n": "allow_domains",
        b"GET http://10.0.0.1/ HTTP/1.1\r\n\r\n": "raw IP",
        b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n": "raw IP",
        b"CONNECT good.test:22 HTTP/1.1\r\n\r\n": "port 22",
        b"GET http://good.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n": "Host header",
        b"GET http://good.test/ HTTP/1.1\r\nHost: good.test:8080\r\n\r\n": "Host header",
        b"GET https://good.test/ HTTP/1.1\r\n\r\n": "absolute http",
        b"CONNECT loop.test:443 HTTP/1.1\r\n\r\n": "loopback",
        b"nonsense\r\n\r\n": "malformed",
    }
    for head, reason in cases.items():
        answer = await ask(port, head)
        assert answer.startswith(b"HTTP/1.1 403 Forbidden"), (head, answer)
        assert reason in answer.decode(), (head, answer)
    assert len(reports) == len(cases)
    assert ("evil.test", "name not in the task's allow_domains") in reports


async def test_a_tunnel_whose_sni_names_another_host_is_cut(
    proxy: tuple[Proxy, int, Reports],
) -> None:
    _, port, reports = proxy
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"CONNECT good.test:443 HTTP/1.1\r\n\r\n")
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="evil.test")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    writer.write(outgoing.read())
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, nothing forwarded
    writer.close()
    assert reports == [
        ("good.test", "TLS server name 'evil.test' does not match CONNECT good.test")
    ]


async def test_the_connection_cap_counts_admitted_connections(
    proxy: tuple[Proxy, int, Reports],
) -> None:
    grant = proxy[0].grants["127.0.0.1"]
    grant.connections = grant.max_connections
    answer = await ask(proxy[1], b"CONNECT good.test:443 HTTP/1.1\r\n\r\n")
    assert b"connection cap of 5 reached" in answer


async def test_idle_connections_beyond_max_open_are_refused(
    proxy: tuple[Proxy, int, Reports],
) -> None:
    server, port, reports = proxy
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    async with asyncio.timeout(10):
        while len(server.grants["127.0.0.1"].open) < 3:  # noqa: ASYNC110 - the proxy took all
            await asyncio.sleep(0.01)
    answer = await ask(port, b"CONNECT good.test:443 HTTP/1.1\r\n\r\n")
    assert b"more than 3 connections open at once" in answer
    for _, writer in idle:
        writer.close()
    assert reports == [("", "more than 3 connections open at once")]


async def test_a_connection_on_an_address_without_a_grant_gets_nothing(
    proxy: tuple[Proxy, int, Reports],
) -> None:
    proxy[0].revoke("127.0.0.1")
    try:
        answer = await ask(proxy[1], b"GET http://good.test/ HTTP/1.1\r\n\r\n")
    except ConnectionResetError:  # closed with the request unread: a reset, also nothing
        answer = b""
    assert answer == b""
    assert proxy[2] == []


class Upstream:
    """A loopback server standing in for good.test: what the proxy sends it, byte for byte.

    It answers once it has the head and its Content-Length body, then records everything
    until the proxy closes the connection, so anything relayed after the checked request
    (a pipelined second one) shows up in `received`.
    """

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.done = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        data = head + await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        writer.write_eof()
        data += await reader.read()  # until the proxy closes its side
        self.received.append(data)
        self.done.set()
        writer.close()


@pytest.fixture
async def relayed(
    proxy: tuple[Proxy, int, Reports],
) -> AsyncIterator[tuple[Proxy, int, Reports, Upstream]]:
    """The proxy, with good.test's checked address (TEST-NET-3) reached at a loopback server."""
    upstream = Upstream()
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def opener(
        _name: str, addresses: list[str], _port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        assert addresses == ["203.0.113.9"]  # the admission ran on the real answer
        return await asyncio.open_connection("127.0.0.1", port)

    proxy[0]._open = opener
    async with server:
        yield (*proxy, upstream)


@pytest.mark.parametrize(
    ("head", "reason"),
    [
        (b"GET http://good.test/ HTTP/1.1\r\nX: a\nHost: evil.test\r\n\r\n", "bare CR or LF"),
        (b"GET http://good.test/ HTTP/1.1\r\nX: a\rHost: evil.test\r\n\r\n", "bare CR or LF"),
        (b"GET http://good.test/ HTTP/1.1\r\nX: a\r\n Host: evil.test\r\n\r\n", "folded"),
        (b"GET http://good.test/ HTTP/1.1\r\nX: a\x00b\r\n\r\n", "malformed header"),
        (b"GET http://good.test/ HTTP/1.1\r\nHo st: evil.test\r\n\r\n", "malformed header"),
        (b"GET http://good.test/\tx HTTP/1.1\r\n\r\n", "malformed request line"),
        (b"GET http://good.test/ HTTP/1.1\nHost: evil.test\r\n\r\n", "bare CR or LF"),
        (b"POST http://good.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", "Transfer"),
        (
            b"POST http://good.test/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "Content-Length",
        ),
        (b"POST http://good.test/ HTTP/1.1\r\nContent-Length: +5\r\n\r\n", "Content-Length"),
        (
            b"GET http://good.test/ HTTP/1.1\r\nHost: good.test\r\nHost: evil.test\r\n\r\n",
            "Host header",
        ),
        (b"GET http://u@good.test/ HTTP/1.1\r\n\r\n", "user names"),
    ],
)
async def test_heads_a_server_could_read_differently_are_refused(
    relayed: tuple[Proxy, int, Reports, Upstream], head: bytes, reason: str
) -> None:
    _, port, reports, upstream = relayed
    answer = await ask(port, head)
    assert answer.startswith(b"HTTP/1.1 403 Forbidden"), answer
    assert reason in answer.decode(), answer
    assert upstream.received == []
    assert len(reports) == 1


async def test_only_the_checked_request_and_its_body_reach_upstream(
    relayed: tuple[Proxy, int, Reports, Upstream],
) -> None:
    _, port, reports, upstream = relayed
    smuggled = b"GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n"
    answer = await ask(
        port,
        b"POST http://good.test/up?x=1 HTTP/1.1\r\nHost: GOOD.test.\r\nContent-Length: 5\r\n"
        b"Connection: keep-alive\r\nX-Keep: yes\r\n\r\nhello" + smuggled,
    )
    assert answer == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    await asyncio.wait_for(upstream.done.wait(), 10)
    assert upstream.received == [
        b"POST /up?x=1 HTTP/1.1\r\nHost: good.test\r\nX-Keep: yes\r\nContent-Length: 5\r\n"
        b"Connection: close\r\n\r\nhello"
    ]
    assert reports == []


@pytest.mark.parametrize(
    "head",
    [
        b"GET http://good.test:99999/ HTTP/1.1\r\n\r\n",
        b"GET http://good.test:0/ HTTP/1.1\r\n\r\n",
        b"GET http://good.test:8o/ HTTP/1.1\r\n\r\n",
        b"CONNECT good.test:65536 HTTP/1.1\r\n\r\n",
        b"CONNECT good.test:-1 HTTP/1.1\r\n\r\n",
        b"CONNECT [good.test]x:443 HTTP/1.1\r\n\r\n",
        b"GET http://[::1/ HTTP/1.1\r\n\r\n",
    ],
)
async def test_bad_ports_and_urls_get_a_403_not_a_crash(
    proxy: tuple[Proxy, int, Reports], head: bytes
) -> None:
    answer = await ask(proxy[1], head)
    assert answer.startswith(b"HTTP/1.1 403 Forbidden"), answer
    assert proxy[0].open_count == 0


async def test_an_unexpected_error_closes_the_connection_and_frees_it() -> None:
    def broken(_grant: Grant, _host: str, _reason: str) -> None:
        raise RuntimeError("a bug")

    proxy = Proxy(broken)
    proxy.grants["127.0.0.1"] = Grant("127.0.0.1", "tsk", 1, (), 1, 1, frozenset({443}))
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    async with server:
        answer = await ask(
            server.sockets[0].getsockname()[1], b"CONNECT a.test:443 HTTP/1.1\r\n\r\n"
        )
    assert answer == b""
    assert proxy.open_count == 0
    assert proxy.grants["127.0.0.1"].open == set()


async def test_refusals_are_reported_within_a_budget_and_a_flood_cuts_the_task_off(
    proxy: tuple[Proxy, int, Reports],
) -> None:
    server, port, reports = proxy
    grant = server.grants["127.0.0.1"]
    grant.report_burst, grant.report_rate, grant.max_refusals = 3, 0.0, 6
    for _ in range(5):
        answer = await ask(port, b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n")
        assert b"allow_domains" in answer  # every refusal still gets its 403
    assert len(reports) == 3  # the 4th and 5th were counted, not reported
    await ask(port, b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n")
    assert reports[-1] == ("evil.test", "6 refusals: egress cut off for this task")
    try:
        answer = await ask(port, b"CONNECT good.test:443 HTTP/1.1\r\n\r\n")
    except ConnectionResetError:
        answer = b""
    assert answer == b""  # cut off: even an allowed name gets nothing
    assert len(reports) == 4


async def test_the_proxy_wide_cap_refuses_past_it(proxy: tuple[Proxy, int, Reports]) -> None:
    server, port, reports = proxy
    server.max_open = 2
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
    async with asyncio.timeout(10):
        while server.open_count < 2:  # noqa: ASYNC110 - the proxy took both
            await asyncio.sleep(0.01)
    answer = await ask(port, b"CONNECT good.test:443 HTTP/1.1\r\n\r\n")
    assert b"the proxy has 2 connections open" in answer
    for _, writer in idle:
        writer.close()
    assert reports == [("", "the proxy has 2 connections open")]


async def test_a_peer_outside_the_tasks_network_gets_nothing(
    proxy: tuple[Proxy, int, Reports],
) -> None:
    proxy[0].grants["127.0.0.1"].peers = rules.parse_networks(["10.213.0.0/28"])
    try:
        answer = await ask(proxy[1], b"CONNECT good.test:443 HTTP/1.1\r\n\r\n")
    except ConnectionResetError:
        answer = b""
    assert answer == b""
    assert proxy[2] == []


async def test_grants_come_over_the_control_socket_and_reports_add_up(tmp_path: Path) -> None:
    """The worker's channel end to end: a grant over the Unix socket, a flood of refusals,
    reports within the budget whose counts add up to every refusal, then the cut-off."""
    control = Control()
    channel = await asyncio.start_unix_server(control.serve, str(tmp_path / "c.sock"))
    server = await asyncio.start_server(control.proxy.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with channel, server:
        reader, writer = await asyncio.open_unix_connection(str(tmp_path / "c.sock"))
        grant = {
            "id": 1, "op": "grant", "key": "127.0.0.1", "subnet": "127.0.0.0/8", "task": "tsk",
            "attempt": 2, "allow": ["good.test"], "max_connections": 5, "max_bytes": 100,
            "ports": [443], "max_refusals": 4,
        }  # fmt: skip
        writer.write(json.dumps(grant).encode() + b"\n")
        assert json.loads(await reader.readline()) == {"id": 1, "ok": True}
        control.proxy.grants["127.0.0.1"].report_burst = 1
        control.proxy.grants["127.0.0.1"].report_rate = 0.0
        for _ in range(3):
            assert b"403" in await ask(port, b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n")
        with contextlib.suppress(ConnectionResetError):  # the 4th: cut off, closed at once
            assert await ask(port, b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n") == b""
        events = [json.loads(await reader.readline()) for _ in range(2)]
        writer.close()
        await writer.wait_closed()
    assert [(e["task"], e["attempt"], e["count"]) for e in events] == [("tsk", 2, 1), ("tsk", 2, 3)]
    assert events[1]["reason"] == "4 refusals: egress cut off for this task"
