"""The filtering forward proxy: HTTP by Host, HTTPS by CONNECT target and TLS SNI.

One listening socket serves every task; which task a connection belongs to is the
address it arrived on (the proxy's own address on that task's private network, the
`Grant.key`), never anything the client says, and its peer must be on that task's
network (`Grant.peers`). A connection is admitted only when its name is allowed by the
task's patterns, is not an IP literal, its port is allowed, the task is under its
connection and byte caps, and the name (resolved here, never by the sandbox, IPv4 only)
leads to an address `rules.refusal` accepts; the proxy then connects to exactly that
address (no second lookup a rebinding server could answer differently).
For CONNECT the ClientHello's SNI must name the CONNECT target. A plain HTTP request
head is parsed strictly (CRLF only, no control characters, no folded lines, one Host at
most and equal to the URL's), sent upstream with the Host written from the URL and
`Connection: close`, followed by exactly its Content-Length body (Transfer-Encoding is
refused); nothing the client sends after that is read, so no second request rides on a
checked one. Refusals are reported (`Report`) within a per-task budget; past
`Grant.max_refusals` the task's egress is cut off.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from . import hello, rules

HEAD_LIMIT = 16384
HEAD_TIMEOUT_S = 15.0
CONNECT_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 300.0
CHUNK = 16384
WRITE_HIGH = 65536
"""Write buffer high-water mark of each side: a slow reader holds at most this much."""
MAX_OPEN_TOTAL = 4096
"""Connections open at once over all tasks (each holds two file handles when relayed)."""
LOOKUPS_PER_TASK = 8
"""Name lookups of one task at once: the rest wait, the shared thread pool stays free."""
HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "host",
        "content-length",
        "transfer-encoding",
        "expect",
        "upgrade",
        "te",
        "trailer",
    }
)
"""Client headers never sent upstream (the proxy writes Host and Content-Length itself)."""
_REQUEST_LINE = re.compile(rb"[A-Za-z]{1,20} [\x21-\x7e]+ HTTP/1\.[01]")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
log = logging.getLogger("egress.proxy")


@dataclass
class Grant:
    """One task's admission: its allow-list, caps and the operator's address rules."""

    key: str
    task: str
    attempt: int
    allow: tuple[str, ...]
    max_connections: int
    max_bytes: int
    ports: frozenset[int]
    exempt: tuple[rules.Network, ...] = ()
    service: tuple[rules.Network, ...] = ()
    hosts: dict[str, str] = field(default_factory=dict)
    """Fixed name -> address answers, consulted before DNS (tests, split horizon)."""
    peers: tuple[rules.Network, ...] = ()
    """Where this task's connections may come from (its network); empty: anywhere."""
    max_open: int = 256
    """Connections of this task open at once, admitted or not (idle ones hold file handles)."""
    max_refusals: int = 1000
    """Refusals after which the task's egress is cut off (a scan, not a confused tool)."""
    report_burst: int = 20
    report_rate: float = 1.0
    """Refusals reported at once and per second; the rest are counted into the next report."""
    connections: int = 0
    bytes: int = 0
    refusals: int = 0
    suppressed: int = 0
    counted: int = 0
    """Refusals already counted in a report to the worker (`control`)."""
    open: set[asyncio.StreamWriter] = field(default_factory=set)
    lookups: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(LOOKUPS_PER_TASK))
    _tokens: float = -1.0
    _stamp: float = 0.0

    @property
    def cut_off(self) -> bool:
        return self.refusals >= self.max_refusals

    def take_report(self) -> bool:
        """A token of the report bucket, if one is left."""
        now = time.monotonic()
        if self._tokens < 0:
            self._tokens, self._stamp = float(self.report_burst), now
        self._tokens = min(
            float(self.report_burst), self._tokens + (now - self._stamp) * self.report_rate
        )
        self._stamp = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


Report = Callable[[Grant, str, str], None]
Opener = Callable[
    [str, list[str], int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
]
"""Connects to one of a name's checked addresses (`_open`; tests pass their own upstream)."""


class Blocked(Exception):
    """A refused connection: the host it asked for and why."""

    def __init__(self, host: str, reason: str, *, late: bool = False) -> None:
        super().__init__(reason)
        self.host, self.reason = host, reason
        self.late = late
        """Raised after the client was answered (200, or bytes relayed): no 403 then."""


@dataclass(frozen=True)
class Head:
    """A request head that passed `parse_head`: header names as sent, values stripped."""

    method: str
    target: str
    version: str
    fields: list[tuple[str, str]]

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.fields if key.lower() == name]


def parse_head(raw: bytes) -> Head:
    """The request line and header fields, or Blocked for anything a server could read
    differently from the proxy: a bare CR or LF, a control character, a folded line."""
    lines = raw.removesuffix(b"\r\n\r\n").split(b"\r\n")
    if any(b"\r" in line or b"\n" in line for line in lines):
        raise Blocked("", "bare CR or LF in the request head")
    if not _REQUEST_LINE.fullmatch(lines[0]):
        raise Blocked("", "malformed request line")
    method, target, version = lines[0].decode("ascii").split(" ")
    fields = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            raise Blocked("", "folded header line")
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name) or _BAD_VALUE.search(value):
            raise Blocked("", "malformed header line")
        fields.append((name.decode("ascii"), value.decode("latin-1").strip(" \t")))
    return Head(method.upper(), target, version, fields)


class Proxy:
    """The grants by key and the connection handler `asyncio.start_server` calls."""

    def __init__(
        self, report: Report, *, max_open: int = MAX_OPEN_TOTAL, opener: Opener | None = None
    ) -> None:
        self.grants: dict[str, Grant] = {}
        self._open = opener or _open
        self.max_open = max_open
        self.open_count = 0
        self._report = report

    def revoke(self, key: str) -> None:
        """Forget a grant and cut its connections (its task ended, or its worker left)."""
        grant = self.grants.pop(key, None)
        for writer in list(grant.open if grant else ()):
            writer.close()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection, whatever happens in it: closed at the end, never raises."""
        self.open_count += 1
        try:
            await self._admit_client(reader, writer)
        except Exception:  # a bug must cost one connection, not the server's file handles
            log.exception("egress connection failed")
        finally:
            self.open_count -= 1
            writer.close()

    async def _admit_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        grant = self.grants.get(str(writer.get_extra_info("sockname")[0]))
        if grant is None or grant.cut_off or not _from_peer(grant, writer):
            return  # not a task's network, its task ended or was cut off: say nothing
        grant.open.add(writer)
        writer.transport.set_write_buffer_limits(high=WRITE_HIGH)
        try:
            if self.open_count > self.max_open:
                raise Blocked("", f"the proxy has {self.max_open} connections open")
            if len(grant.open) > grant.max_open:
                raise Blocked("", f"more than {grant.max_open} connections open at once")
            await self._serve(grant, reader, writer)
        except Blocked as exc:
            self._refused(grant, exc.host, exc.reason)
            if not exc.late:
                await _forbid(writer, exc.reason)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            grant.open.discard(writer)

    def _refused(self, grant: Grant, host: str, reason: str) -> None:
        """Count a refusal; report it within the task's budget; cut the task off at the cap."""
        grant.refusals += 1
        if grant.refusals == grant.max_refusals:
            self._report(grant, host, f"{grant.refusals} refusals: egress cut off for this task")
            for writer in list(grant.open):
                writer.close()
        elif grant.refusals > grant.max_refusals:
            return
        elif grant.take_report():
            if grant.suppressed:
                reason += f" (and {grant.suppressed} more refused since the last report)"
                grant.suppressed = 0
            self._report(grant, host, reason)
        else:
            grant.suppressed += 1

    async def _serve(
        self, grant: Grant, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            head = parse_head(await reader.readuntil(b"\r\n\r\n"))
        if head.method == "CONNECT":
            await self._tunnel(grant, head.target, reader, writer)
        else:
            await self._forward(grant, head, reader, writer)

    async def _tunnel(
        self,
        grant: Grant,
        target: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        host, port = split_host_port(target, default=443)
        name, addresses = await self._admit(grant, host, port)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            header = await reader.readexactly(hello.RECORD_HEADER)
            try:
                body = await reader.readexactly(hello.record_length(header))
                sni = hello.server_name(header + body)
            except hello.HelloError as exc:
                raise Blocked(name, f"TLS ClientHello refused: {exc}", late=True) from exc
        if sni.lower().removesuffix(".") != name:
            reason = f"TLS server name {sni!r} does not match CONNECT {name}"
            raise Blocked(name, reason, late=True)
        upstream = await self._open(name, addresses, port)
        upload = self._pump(grant, reader, upstream[1])
        await self._relay(grant, name, header + body, upload, writer, upstream)

    async def _forward(
        self,
        grant: Grant,
        head: Head,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        host, port, path = _http_target(head.target)
        length = _body_length(host, head)
        name, addresses = await self._admit(grant, host, port)
        for given in head.values("host"):
            given_host, given_port = split_host_port(given, default=80)
            if given_host.lower().removesuffix(".") != name or given_port != port:
                raise Blocked(name, f"Host header {given!r} does not match {name}")
        kept = [f"{k}: {v}" for k, v in head.fields if k.lower() not in HOP_HEADERS]
        authority = name if port == 80 else f"{name}:{port}"
        sized = [f"Content-Length: {length}"] if head.values("content-length") else []
        lines = [f"{head.method} {path} {head.version}", f"Host: {authority}", *kept, *sized]
        first = "\r\n".join([*lines, "Connection: close", "", ""]).encode("latin-1")
        if length and any(v.lower() == "100-continue" for v in head.values("expect")):
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # Expect is not sent upstream
        upstream = await self._open(name, addresses, port)
        upload = self._copy_body(grant, reader, upstream[1], length)
        await self._relay(grant, name, first, upload, writer, upstream)

    async def _admit(self, grant: Grant, host: str, port: int) -> tuple[str, list[str]]:
        """The normalized name and the addresses it may be reached at; Blocked otherwise."""
        if rules.is_ip_literal(host):
            raise Blocked(host, "raw IP addresses are refused (ask for a name)")
        try:
            name = rules.normalize_name(host)
        except ValueError as exc:
            raise Blocked(host, str(exc)) from exc
        if not rules.matches(name, grant.allow):
            raise Blocked(name, "name not in the task's allow_domains")
        if port not in grant.ports:
            raise Blocked(name, f"port {port} not allowed")
        if grant.bytes >= grant.max_bytes:
            raise Blocked(name, f"byte cap of {grant.max_bytes} reached")
        if grant.connections >= grant.max_connections:
            raise Blocked(name, f"connection cap of {grant.max_connections} reached")
        grant.connections += 1
        found = await _resolve(grant, name, port)
        allowed = [a for a in found if rules.refusal(a, grant.exempt, grant.service) is None]
        if not allowed:
            reason = rules.refusal(found[0], grant.exempt, grant.service) if found else None
            raise Blocked(name, reason or "name does not resolve")
        return name, allowed

    async def _relay(
        self,
        grant: Grant,
        name: str,
        first: bytes,
        upload: Coroutine[Any, Any, None],
        writer: asyncio.StreamWriter,
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        """Send `first`, then run `upload` and copy the answer back until both are done; the
        byte cap cuts both (reported late)."""
        up_reader, up_writer = upstream
        grant.open.add(up_writer)
        pumps: list[asyncio.Future[None]] = []
        try:
            self._count(grant, len(first))
            up_writer.write(first)
            pumps = [
                asyncio.ensure_future(upload),
                asyncio.ensure_future(self._pump(grant, up_reader, writer)),
            ]
            done, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for task in done:
                exc = task.exception()
                if isinstance(exc, Blocked):
                    raise Blocked(name, exc.reason, late=True)
        finally:
            if not pumps:
                upload.close()  # never started: `first` hit the byte cap
            for task in pumps:
                task.cancel()
            grant.open.discard(up_writer)
            up_writer.close()

    async def _pump(
        self, grant: Grant, src: asyncio.StreamReader, dst: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(OSError, TimeoutError):
            while True:
                async with asyncio.timeout(IDLE_TIMEOUT_S):
                    chunk = await src.read(CHUNK)
                if not chunk:
                    if dst.can_write_eof():
                        dst.write_eof()
                    return
                self._count(grant, len(chunk))
                dst.write(chunk)
                await dst.drain()

    async def _copy_body(
        self, grant: Grant, src: asyncio.StreamReader, dst: asyncio.StreamWriter, length: int
    ) -> None:
        """Exactly `length` bytes of request body; the client's later bytes are never read."""
        with contextlib.suppress(OSError, TimeoutError):
            while length > 0:
                async with asyncio.timeout(IDLE_TIMEOUT_S):
                    chunk = await src.read(min(CHUNK, length))
                if not chunk:
                    return
                length -= len(chunk)
                self._count(grant, len(chunk))
                dst.write(chunk)
                await dst.drain()

    def _count(self, grant: Grant, n: int) -> None:
        grant.bytes += n
        if grant.bytes > grant.max_bytes:
            raise Blocked("", f"byte cap of {grant.max_bytes} reached")


async def _forbid(writer: asyncio.StreamWriter, reason: str) -> None:
    with contextlib.suppress(OSError):
        body = f"sandhive egress proxy: {reason}\n".encode()
        head = f"HTTP/1.1 403 Forbidden\r\nContent-Length: {len(body)}\r\n"
        writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
        await writer.drain()


def _from_peer(grant: Grant, writer: asyncio.StreamWriter) -> bool:
    if not grant.peers:
        return True
    peer = ipaddress.ip_address(str(writer.get_extra_info("peername")[0]))
    return any(peer in net for net in grant.peers)


def _http_target(target: str) -> tuple[str, int, str]:
    """Host, port and origin-form path of an absolute `http://` request target."""
    try:
        url = urlsplit(target)
    except ValueError as exc:
        raise Blocked("", f"malformed URL: {exc}") from exc
    if url.scheme != "http" or not url.netloc:
        raise Blocked(url.hostname or "", "only absolute http:// URLs (use CONNECT for TLS)")
    if "@" in url.netloc:
        raise Blocked("", "user names in URLs are refused")
    host, port = split_host_port(url.netloc, default=80)
    return host, port, (url.path or "/") + (f"?{url.query}" if url.query else "")


def _body_length(name: str, head: Head) -> int:
    """The request body's length: Content-Length, one value, digits only; no chunking."""
    if head.values("transfer-encoding"):
        raise Blocked(name, "Transfer-Encoding is refused (send a Content-Length)")
    given = set(head.values("content-length"))
    if not given:
        return 0
    text = given.pop()
    if given or not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise Blocked(name, "malformed Content-Length")
    return int(text)


async def _resolve(grant: Grant, name: str, port: int) -> list[str]:
    if name in grant.hosts:
        return [grant.hosts[name]]
    loop = asyncio.get_running_loop()
    try:
        async with grant.lookups, asyncio.timeout(CONNECT_TIMEOUT_S):
            infos = await loop.getaddrinfo(
                name, port, family=socket.AF_INET, type=socket.SOCK_STREAM
            )
    except (OSError, TimeoutError):
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def _open(
    name: str, addresses: list[str], port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the first of the checked addresses that answers (never a fresh lookup)."""
    error: Exception | None = None
    for address in addresses:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(address, port, limit=CHUNK)
            writer.transport.set_write_buffer_limits(high=WRITE_HIGH)
            return reader, writer
        except (OSError, TimeoutError) as exc:
            error = exc
    raise OSError(f"cannot connect to {name}:{port}: {error!r}")


def split_host_port(text: str, *, default: int) -> tuple[str, int]:
    """`host[:port]` or `[v6][:port]`; Blocked unless the port is 1..65535 in ASCII digits."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise Blocked(host, f"malformed authority {text!r}")
        port = rest.removeprefix(":")
    else:
        host, _, port = text.rpartition(":") if ":" in text else (text, "", "")
    if not port:
        return host, default
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536):
        raise Blocked(host, f"bad port in {text!r}")
    return host, int(port)
