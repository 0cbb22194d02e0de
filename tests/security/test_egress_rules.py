"""The egress proxy's pure parts: name patterns, the ceiling, address refusals (the table of
address forms no one reaches, shared with webhooks: test_addresses.py), ClientHello SNI."""

from __future__ import annotations

import ssl
import struct

import pytest
from pydantic import ValidationError

from app.config import Settings
from app.egress import hello, rules
from app.egress.control import grant_of


def client_hello(server_name: str | None) -> bytes:
    """The first TLS record a real client (Python's ssl) sends for this server name."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    if server_name is None:
        ctx.check_hostname = False
        conn = ctx.wrap_bio(incoming, outgoing, server_hostname=None)
    with pytest.raises(ssl.SSLWantReadError):
        conn.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize(
    ("name", "patterns", "allowed"),
    [
        ("pypi.org", ["pypi.org"], True),
        ("files.pypi.org", ["pypi.org"], False),
        ("a.example.com", ["*.example.com"], True),
        ("a.b.example.com", ["*.example.com"], True),
        ("example.com", ["*.example.com"], False),
        ("badexample.com", ["*.example.com"], False),
        ("example.com.evil.net", ["*.example.com", "example.com"], False),
        ("x.org", [], False),
    ],
)
def test_patterns_match_exact_names_and_strict_subdomains(
    name: str, patterns: list[str], allowed: bool
) -> None:
    assert rules.matches(name, patterns) is allowed


@pytest.mark.parametrize(
    "raw", ["10.0.0.1", "[::1]", "::1", "2130706433", "0x7f.1", "a..b", "-a.com", "*", "a_b.com"]
)
def test_ip_literals_and_junk_are_not_names(raw: str) -> None:
    with pytest.raises(ValueError, match=r"not a host name|IP address"):
        rules.normalize_pattern(raw)


def test_names_are_normalized() -> None:
    assert rules.normalize_name("PyPI.Org.") == "pypi.org"
    assert rules.normalize_pattern(" *.Example.COM ") == "*.example.com"


def test_a_task_cannot_widen_the_ceiling() -> None:
    ceiling = ["pypi.org", "*.example.com"]
    assert rules.outside_ceiling(["pypi.org", "a.example.com", "*.b.example.com"], ceiling) == []
    assert rules.outside_ceiling(["*.example.com"], ceiling) == []
    assert rules.outside_ceiling(["*.pypi.org", "example.com", "x.org"], ceiling) == [
        "*.pypi.org",
        "example.com",
        "x.org",
    ]
    assert rules.outside_ceiling(["a.org"], []) == ["a.org"]


def test_private_addresses_need_an_exemption_and_the_service_plane_never_opens() -> None:
    exempt = rules.parse_networks(["172.30.0.0/16"])
    service = rules.parse_networks(["172.30.5.0/24"])
    assert rules.refusal("10.1.2.3", exempt, service) == "address 10.1.2.3 is private"
    assert rules.refusal("192.168.1.1", exempt, service) is not None
    assert rules.refusal("100.64.0.1", exempt, service) is not None  # CGNAT
    assert rules.refusal("fd12::1", exempt, service) is not None  # ULA
    assert rules.refusal("172.30.1.1", exempt, service) is None
    assert (
        rules.refusal("172.30.5.9", exempt, service) == "address 172.30.5.9 is on the service plane"
    )
    assert rules.refusal("8.8.8.8", (), ()) is None
    assert rules.refusal("2001:4860:4860::8888", (), ()) is None


def test_the_server_name_of_a_real_client_hello() -> None:
    record = client_hello("files.Example.org")
    assert hello.server_name(record) == "files.Example.org"


def test_a_client_hello_without_sni_is_refused() -> None:
    with pytest.raises(hello.HelloError, match="no server name"):
        hello.server_name(client_hello(None))


@pytest.mark.parametrize(
    "record",
    [
        b"GET / HTTP/1.1\r\n\r\n",
        b"\x16\x03\x01\x00\x00",
        b"\x17\x03\x03\x00\x05hello",
        b"\x16\x03\x01\x00\x04\x01\x00\x00\x50",  # a ClientHello longer than its record
    ],
)
def test_what_is_not_a_client_hello_is_refused(record: bytes) -> None:
    with pytest.raises(hello.HelloError):
        hello.server_name(record)


def test_every_truncation_of_a_client_hello_is_a_hello_error() -> None:
    record = client_hello("a.example.com")
    for cut in range(len(record)):
        broken = record[:cut]
        try:
            hello.server_name(broken)
        except hello.HelloError:
            continue
        raise AssertionError(f"a ClientHello cut at {cut} bytes parsed")


def test_a_grant_message_is_checked() -> None:
    msg = {
        "key": "10.0.0.2",
        "task": "tsk_1",
        "attempt": 1,
        "allow": ["*.Example.com"],
        "max_connections": 3,
        "max_bytes": 10,
        "ports": [443],
        "hosts": {"a.example.com": "10.0.0.9"},
        "subnet": "10.213.0.0/28",
        "max_open": 7,
    }
    grant = grant_of(msg)
    assert grant.allow == ("*.example.com",)
    assert grant.ports == frozenset({443})
    assert grant.peers == rules.parse_networks(["10.213.0.0/28"])
    assert grant.max_open == 7
    with pytest.raises(KeyError, match="subnet"):  # no grant open to any peer
        grant_of({k: v for k, v in msg.items() if k != "subnet"})
    with pytest.raises(ValueError, match="IP address"):
        grant_of({**msg, "allow": ["10.0.0.9"]})


@pytest.mark.parametrize(
    "raw",
    ["0xa9fea9fe", "0x7f.0xff", "0x7f.1.evil.test", "a.0x.test", "0177.1", "127.1", "0x7F.1."],
)
def test_hex_and_short_forms_a_resolver_reads_as_addresses_are_not_names(raw: str) -> None:
    assert rules.is_ip_literal(raw)
    with pytest.raises(ValueError, match="IP address"):
        rules.normalize_pattern(raw)
    with pytest.raises(ValueError, match="IP address"):
        rules.normalize_pattern("*." + raw)


def test_the_ceiling_setting_refuses_hex_addresses() -> None:
    with pytest.raises(ValidationError, match="IP address"):
        Settings(sandbox_egress_domains=["pypi.org", "0xa9fea9fe"])


def fake_hello(extensions: list[tuple[int, bytes]]) -> bytes:
    """A minimal ClientHello record with exactly these extensions (kind, body)."""
    exts = b"".join(struct.pack("!HH", kind, len(data)) + data for kind, data in extensions)
    body = b"\x03\x03" + bytes(32) + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    body += struct.pack("!H", len(exts)) + exts
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack("!H", len(handshake)) + handshake


def sni(*names: bytes, kind: int = 0) -> bytes:
    entries = b"".join(bytes([kind]) + struct.pack("!H", len(n)) + n for n in names)
    return struct.pack("!H", len(entries)) + entries


def test_a_hand_made_client_hello_parses() -> None:
    assert hello.server_name(fake_hello([(10, b"\x00\x02\x00\x1d"), (0, sni(b"a.test"))])) == (
        "a.test"
    )


@pytest.mark.parametrize(
    ("extensions", "reason"),
    [
        ([(0, sni(b"a.test")), (0xFE0D, b"\x00\x00")], "encrypted"),
        ([(0xFE0D, b"\x00"), (0, sni(b"a.test"))], "encrypted"),
        ([(0, sni(b"a.test")), (0xFFCE, b"\x00")], "encrypted"),
        ([(0, sni(b"a.test")), (0, sni(b"evil.test"))], "repeats extension"),
        ([(10, b""), (0, sni(b"a.test")), (10, b"")], "repeats extension"),
        ([(0, sni(b"a.test", b"evil.test"))], "exactly one host name"),
        ([(0, sni(b"a.test", kind=1))], "exactly one host name"),
        ([(0, sni(b"a.test") + b"x")], "after the server_name list"),
    ],
)
def test_hellos_that_hide_or_double_the_name_are_refused(
    extensions: list[tuple[int, bytes]], reason: str
) -> None:
    with pytest.raises(hello.HelloError, match=reason):
        hello.server_name(fake_hello(extensions))
