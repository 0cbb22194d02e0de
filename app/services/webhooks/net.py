"""Where a webhook may go, and how it is sent there without being steered elsewhere.

SSRF rules: a webhook reaches only public addresses, as the egress proxy judges them
(`app.egress.rules.refusal`, the one address policy: an IPv6 form of an internal IPv4
address is judged as that address). The name is resolved here,
every address it resolves to must pass, and the request then connects to the
checked address itself (the URL's host swapped for it, `Host` and TLS SNI kept
as the name), so a second DNS answer cannot point the connection at the host's
own network. Redirects are never followed. `webhook_allowed_hosts` opens
exceptions by name, address or CIDR (tests' loopback receivers, internal
services); `webhook_hosts` answers names without DNS (split horizon, tests), and
its answers are checked like DNS's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit, urlunsplit

import httpx

from app.egress import rules
from app.errors import InvalidInput

Address = rules.Address
Network = rules.Network

_LOCAL_NAMES = ("localhost", "localhost.localdomain")


class Refused(Exception):
    """This URL may not be called (its address, its scheme, or its name)."""


@dataclass(frozen=True)
class Allow:
    """`webhook_allowed_hosts`, parsed: names and networks let through although private."""

    names: frozenset[str]
    networks: tuple[Network, ...]

    @classmethod
    def of(cls, entries: list[str]) -> Allow:
        names: set[str] = set()
        networks: list[Network] = []
        for entry in entries:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                try:
                    names.add(_ascii(entry.strip()))
                except UnicodeError:  # no IDNA form (`a..b`): no URL's host can match it
                    names.add(entry.strip().lower().rstrip("."))
        return cls(frozenset(names), tuple(networks))

    def refusal(self, address: Address) -> str | None:
        """Why a webhook may not go to this address, or None when it may.

        The operator's networks come first and open any address they hold, loopback and
        metadata included (tests' receivers, internal services), also wrapped in IPv6;
        every other address is judged by the egress proxy's policy.
        """
        held = (address, rules.unwrapped(address))
        if any(a in network for network in self.networks for a in held):
            return None
        return rules.refusal(address)


def answers(entries: list[str]) -> dict[str, Address]:
    """`webhook_hosts` (`name=address`, checked by Settings), as name -> address."""
    pairs = (entry.partition("=") for entry in entries)
    return {rules.normalize_name(name): ipaddress.ip_address(a.strip()) for name, _, a in pairs}


def check_url(url: str, allow: Allow) -> None:
    """Refuse what is plainly not allowed before any DNS (a literal private address,
    localhost, a scheme other than http(s), credentials in the URL): 422 at registration."""
    if any(not "\x20" < char < "\x7f" and char.isascii() for char in url):
        # Spaces and control characters: httpx refuses them at send time, when the
        # delivery could only fail; say so now.
        raise InvalidInput("not a valid URL: a space or control character", {"field": "url"})
    try:
        parts = urlsplit(url)
        _ = parts.port  # a port out of range or not a number raises here
        host = _host(parts)
        httpx.URL(url)
    except (ValueError, httpx.InvalidURL) as exc:
        raise InvalidInput(f"not a valid URL: {exc}", {"field": "url"}) from None
    if parts.scheme not in ("http", "https") or not host:
        raise InvalidInput("the URL must be http:// or https:// with a host", {"field": "url"})
    if parts.username or parts.password:
        raise InvalidInput(
            "no credentials in the URL: verify the signature instead", {"field": "url"}
        )
    reason = None if host in allow.names else _host_refusal(host, allow)
    if reason is not None:
        raise InvalidInput(f"{reason} (see SANDHIVE_WEBHOOK_ALLOWED_HOSTS)", {"field": "url"})


def _host_refusal(host: str, allow: Allow) -> str | None:
    """Why this host (as the resolver reads it) is refused without asking DNS, or None."""
    if host in _LOCAL_NAMES or host.endswith(".localhost"):
        return f"{host} is a loopback name"
    literal = _literal(host)
    if literal is None:
        if rules.is_ip_literal(host):  # 0x7f.1, 2130706433, 127.1: inet_aton's forms
            return f"{host} is read as an address by resolvers: write the address itself"
        return None
    reason = allow.refusal(literal)
    return None if reason is None else f"{host} is not a public address: {reason}"


async def post(
    url: str,
    body: bytes,
    headers: dict[str, str],
    allow: Allow,
    *,
    hosts: Mapping[str, Address],
    timeout_s: float,
    max_response_bytes: int,
) -> int:
    """POST to the checked address of `url`; the status code (no redirect followed).

    `hosts` answers names before DNS is asked (`webhook_hosts`).

    Raises Refused for a disallowed address, httpx/OS errors for transport failures,
    TimeoutError past `timeout_s` for the whole exchange.
    """
    parts = urlsplit(url)
    try:
        host = _host(parts)
    except ValueError:
        raise Refused(f"{parts.hostname} is not a host name") from None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    async with asyncio.timeout(timeout_s):
        addresses = await _checked_addresses(host, port, allow, hosts)
        for address in addresses[:-1]:  # like a browser: the next address if one is down
            try:
                return await _post_to(
                    address, parts, host, port, body, headers, timeout_s, max_response_bytes
                )
            except httpx.ConnectError:
                continue
        return await _post_to(
            addresses[-1], parts, host, port, body, headers, timeout_s, max_response_bytes
        )


async def _post_to(
    address: Address,
    parts: SplitResult,
    host: str,
    port: int,
    body: bytes,
    headers: dict[str, str],
    timeout_s: float,
    max_response_bytes: int,
) -> int:
    """POST to this (checked) address, as `host`: the Host header and TLS SNI/cert name."""
    netloc = f"[{address}]" if address.version == 6 else str(address)
    pinned = urlunsplit((parts.scheme, f"{netloc}:{port}", parts.path or "/", parts.query, ""))
    name = f"[{host}]" if ":" in host else host
    host_header = name if parts.port is None else f"{name}:{parts.port}"
    extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s), follow_redirects=False, trust_env=False
    ) as client:
        request = client.build_request(
            "POST",
            pinned,
            content=body,
            headers={**headers, "Host": host_header},
            extensions=extensions,
        )
        response = await client.send(request, stream=True)
        try:
            read = 0
            async for chunk in response.aiter_raw():
                read += len(chunk)
                if read >= max_response_bytes:
                    break
        finally:
            await response.aclose()
        return response.status_code


async def _checked_addresses(
    host: str, port: int, allow: Allow, hosts: Mapping[str, Address]
) -> list[Address]:
    """The addresses to connect to: every address of the name must be allowed."""
    literal = _literal(host)
    if literal is not None:
        addresses = [literal]
    elif host in hosts:
        addresses = [hosts[host]]
    else:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise OSError(f"cannot resolve {host}: {exc}") from None
        addresses = [ipaddress.ip_address(info[4][0]) for info in infos]
        if not addresses:
            raise OSError(f"{host} has no address")
    if host not in allow.names:
        for address in addresses:
            if (reason := allow.refusal(address)) is not None:
                raise Refused(
                    f"{host} resolves to {address}, which is not a public address: {reason}"
                )
    return list(dict.fromkeys(addresses))


def _host(parts: SplitResult) -> str:
    """The URL's host as the resolver will read it, and so the one text every check judges:
    its ASCII (IDNA) form, lower case, no trailing dot. getaddrinfo applies the same codec, so
    a full-width `127.0.0.1` or `localhost` (or one ending in an ideographic full stop) is
    loopback here too, as it is there.
    ValueError when the name has no such form (an empty or over-long label)."""
    host = parts.hostname or ""
    return host if _literal(host) is not None else _ascii(host)


def _ascii(name: str) -> str:
    return name.encode("idna").decode("ascii").lower().rstrip(".")


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
