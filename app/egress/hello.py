"""The server name (SNI) of a TLS ClientHello, read without terminating TLS.

The proxy never decrypts: it reads the first TLS record the client sends after
CONNECT, takes the `server_name` extension from the ClientHello and compares it with
the CONNECT target. A ClientHello split over several records, one without SNI, or
anything that does not parse is refused (a browser, curl, pip or git never send those
to a named host), so a forged or missing SNI cannot slip past the name check. So is
one the proxy cannot be sure it read the one name of: Encrypted Client Hello (the real
name is inside the encrypted inner hello) or its ESNI draft, an extension given twice
(RFC 8446 forbids it; servers differ on which copy wins), a server_name list with more
than one entry. What this cannot stop is domain fronting: a server that serves several
names on one certificate may route by the HTTP Host inside the tunnel (docs/network.md).
"""

from __future__ import annotations

import struct

RECORD_HEADER = 5
MAX_RECORD = 16384 + 2048
"""A TLS plaintext record is at most 2^14 bytes; a little slack for odd clients."""
HANDSHAKE = 22
CLIENT_HELLO = 1
SERVER_NAME = 0
HOST_NAME = 0
ENCRYPTED_CLIENT_HELLO = 0xFE0D
ENCRYPTED_SERVER_NAME = 0xFFCE
"""The ESNI draft's extension, still sent by some old clients."""


class HelloError(ValueError):
    """Not a ClientHello the proxy can read a server name from."""


def record_length(header: bytes) -> int:
    """The body length of the TLS record whose 5-byte header this is; HelloError if not TLS."""
    if len(header) != RECORD_HEADER or header[0] != HANDSHAKE or header[1] != 3:
        raise HelloError("not a TLS handshake record")
    length = int.from_bytes(header[3:5], "big")
    if not 0 < length <= MAX_RECORD:
        raise HelloError(f"TLS record length {length} out of range")
    return length


def server_name(record: bytes) -> str:
    """The SNI host name of the ClientHello in this record (5-byte header included)."""
    body = record[RECORD_HEADER : RECORD_HEADER + record_length(record[:RECORD_HEADER])]
    reader = _Reader(body)
    if reader.u8() != CLIENT_HELLO:
        raise HelloError("first handshake message is not a ClientHello")
    if reader.u24() > len(body) - 4:
        raise HelloError("ClientHello split across records")
    reader.skip(2 + 32)  # client_version, random
    reader.skip(reader.u8())  # session id
    reader.skip(reader.u16())  # cipher suites
    reader.skip(reader.u8())  # compression methods
    extensions = _Reader(reader.take(reader.u16()))
    seen: set[int] = set()
    found: str | None = None
    while extensions.left():
        kind, data = extensions.u16(), extensions.take(extensions.u16())
        if kind in seen:
            raise HelloError(f"ClientHello repeats extension {kind:#06x}")
        seen.add(kind)
        if kind in (ENCRYPTED_CLIENT_HELLO, ENCRYPTED_SERVER_NAME):
            raise HelloError("encrypted ClientHello (ECH/ESNI) hides the server name")
        if kind == SERVER_NAME:
            found = _host_name(_Reader(data))
    if found is None:
        raise HelloError("ClientHello has no server name")
    return found


def _host_name(ext: _Reader) -> str:
    names = _Reader(ext.take(ext.u16()))
    if ext.left():
        raise HelloError("bytes after the server_name list")
    entries = []
    while names.left():
        entries.append((names.u8(), names.take(names.u16())))
    if len(entries) != 1 or entries[0][0] != HOST_NAME:
        raise HelloError("server_name must hold exactly one host name")
    try:
        return entries[0][1].decode("ascii")
    except UnicodeDecodeError as exc:
        raise HelloError("server name is not ASCII") from exc


class _Reader:
    """Bounds-checked big-endian reads: every overrun is a HelloError, never an IndexError."""

    def __init__(self, data: bytes) -> None:
        self._data, self._at = data, 0

    def left(self) -> int:
        return len(self._data) - self._at

    def take(self, n: int) -> bytes:
        if n > self.left():
            raise HelloError("truncated ClientHello")
        chunk = self._data[self._at : self._at + n]
        self._at += n
        return chunk

    def skip(self, n: int) -> None:
        self.take(n)

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        value: int = struct.unpack("!H", self.take(2))[0]
        return value

    def u24(self) -> int:
        return int.from_bytes(self.take(3), "big")
