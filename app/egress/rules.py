"""Which names a task may reach, and which addresses no name may lead to.

Patterns are exact names (`pypi.org`) or `*.suffix` (any name strictly below the suffix:
`*.example.com` matches `a.example.com` and `a.b.example.com`, not `example.com`).
Addresses are checked after the proxy resolved the name itself, so a name that points at
the metadata service, loopback or a private network is refused whatever it is called.

`refusal` is Sandhive's one policy for addresses it connects out to: the egress proxy and
the webhook sender (`app.services.webhooks.net`, which imports this module) both judge by
it, so an IPv6 form one of them unwraps the other cannot miss. Standard library only.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_HEX_LABEL = re.compile(r"0x[0-9a-f]*")
MAX_NAME = 253
UNICAST_V6 = ipaddress.ip_network("2000::/3")
"""The only IPv6 addresses the proxy connects to (global unicast), once unwrapped."""
NAT64 = ipaddress.ip_network("64:ff9b::/96")
"""The well-known NAT64 prefix: the IPv4 address is its last 32 bits. The local-use
`64:ff9b:1::/48` is not unwrapped: its operator chooses where in the address the IPv4 one
sits, so no reading of it is safe, and it is refused as not global unicast."""
COMPAT_V4 = ipaddress.ip_network("::/96")

ALWAYS_REFUSED: tuple[Network, ...] = tuple(
    ipaddress.ip_network(cidr)
    for cidr in (
        "0.0.0.0/8",  # "this network"
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local: AWS/GCP/Azure metadata
        "100.100.100.200/32",  # Alibaba Cloud metadata
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, broadcast
        "::/128",
        "::1/128",
        "fe80::/10",  # link-local
        "fd00:ec2::254/128",  # AWS metadata over IPv6
        "ff00::/8",  # multicast
    )
)
"""Refused even when an operator's exemption covers them."""


def normalize_name(raw: str) -> str:
    """A host name, lower case, without a trailing dot; ValueError unless it is a DNS name.

    IP literals are refused here (a task names hosts, the proxy resolves them), as are
    names with characters DNS has no place for (IDNs must come in their `xn--` form).
    """
    name = raw.strip().lower().removesuffix(".")
    if is_ip_literal(name):
        raise ValueError(f"{raw!r} is an IP address, not a name")
    labels = name.split(".")
    if not name or len(name) > MAX_NAME or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"{raw!r} is not a host name")
    if labels[-1].isdigit():
        raise ValueError(f"{raw!r} is not a host name (numeric last label)")
    return name


def is_ip_literal(host: str) -> bool:
    """An IPv4/IPv6 address, bracketed or not, or a number a resolver would read as one.

    Resolvers (glibc's `inet_aton`, curl, browsers) read `0xa9fea9fe`, `0x7f.1`, `0177.1`
    or `2130706433` as addresses: whatever `inet_aton` accepts, and any label that looks
    hexadecimal, counts as a literal, so none of them can pass as a name.
    """
    bare = host.strip().strip("[]").lower().removesuffix(".")
    try:
        ipaddress.ip_address(bare)
        return True
    except ValueError:
        pass
    try:
        socket.inet_aton(bare)
        return True
    except (OSError, ValueError):  # ValueError: an embedded NUL
        pass
    if any(_HEX_LABEL.fullmatch(label) for label in bare.split(".")):
        return True
    return bool(re.fullmatch(r"[0-9.]+", bare))


def normalize_pattern(raw: str) -> str:
    """An exact name or `*.suffix`, normalized; ValueError for anything else."""
    text = raw.strip().lower()
    if text.startswith("*."):
        return "*." + normalize_name(text[2:])
    return normalize_name(text)


def matches(name: str, patterns: Iterable[str]) -> bool:
    """Whether a normalized name is allowed by any of the normalized patterns."""
    for pattern in patterns:
        if pattern.startswith("*."):
            if name.endswith(pattern[1:]):
                return True
        elif name == pattern:
            return True
    return False


def covered(pattern: str, ceiling: Iterable[str]) -> bool:
    """Whether everything `pattern` allows is allowed by `ceiling` (so a task cannot widen it)."""
    limits = list(ceiling)
    if not pattern.startswith("*."):
        return matches(pattern, limits)
    return any(
        limit.startswith("*.") and (pattern == limit or pattern.endswith(limit[1:]))
        for limit in limits
    )


def outside_ceiling(patterns: Sequence[str], ceiling: Sequence[str]) -> list[str]:
    """The requested patterns the ceiling does not cover (empty: the request is within it)."""
    return [p for p in patterns if not covered(p, ceiling)]


def parse_networks(items: Iterable[str]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(item.strip(), strict=False) for item in items)


def refusal(
    address: str | Address, exempt: Sequence[Network] = (), service: Sequence[Network] = ()
) -> str | None:
    """Why Sandhive must not connect to this resolved address, or None when it may.

    Order matters: the always-refused ranges and the service plane come before the
    operator's exemption, so no exemption opens the metadata service or the service's
    own hosts; everything not global (RFC 1918, CGNAT, ULA ...) is then refused unless
    an exempted CIDR covers it. A zone id (`%eth0`) picks an interface, which no public
    address needs: refused rather than let a URL steer the connection out of one.
    """
    outer: Address = ipaddress.ip_address(address)
    if isinstance(outer, ipaddress.IPv6Address) and outer.scope_id is not None:
        return f"address {outer} names a zone (an interface)"
    ip = unwrapped(outer)
    if isinstance(ip, ipaddress.IPv6Address) and ip not in UNICAST_V6:
        return f"address {ip} is not global unicast IPv6 (2000::/3)"
    if any(a in net for net in ALWAYS_REFUSED for a in (outer, ip)):
        return f"address {ip} is loopback, link-local, metadata or reserved"
    if any(a in net for net in service for a in (outer, ip)):
        return f"address {ip} is on the service plane"
    if any(ip in net for net in exempt):
        return None
    if not ip.is_global:
        return f"address {ip} is private"
    return None


def unwrapped(ip: Address) -> Address:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, NAT64, compatible, Teredo), else
    the address itself: `::ffff:127.0.0.1`, `2002:7f00:1::`, `64:ff9b::a9fe:a9fe` and
    `::10.0.0.1` are judged as the IPv4 address they reach. (`::ffff:0:a.b.c.d`, SIIT's
    translated form, is left whole: outside 2000::/3, it is refused as it stands.)"""
    if isinstance(ip, ipaddress.IPv4Address):
        return ip
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in NAT64 or (ip in COMPAT_V4 and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip
