"""One address policy, two callers: every form in `NEVER_PUBLIC` is refused by the egress
proxy's rules (even when an operator exempts everything) and by webhooks, at registration
and at send time (`app.egress.rules`, `app.services.webhooks.net`)."""

from __future__ import annotations

import pytest

from app.egress import rules
from app.errors import InvalidInput
from app.services.webhooks.net import Allow, Refused, check_url, post

NEVER_PUBLIC = [
    "127.0.0.1",
    "169.254.169.254",  # the cloud metadata service
    "100.100.100.200",  # Alibaba Cloud's
    "0.0.0.0",
    "224.0.0.1",
    "::1",
    "::",
    "fe80::1",
    "fd00:ec2::254",  # AWS metadata over IPv6
    "fec0::1",  # site-local
    "100::1",  # discard
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:169.254.169.254",
    "::127.0.0.1",  # IPv4-compatible
    "::169.254.169.254",
    "::ffff:0:169.254.169.254",  # IPv4-translated (SIIT)
    "64:ff9b::127.0.0.1",  # NAT64, well-known prefix
    "64:ff9b::a9fe:a9fe",
    "64:ff9b:1:7f00:0:100:808:808",  # NAT64 local-use /48: 127.0.0.1 there, 8.8.8.8 at /96
    "2002:7f00:1::",  # 6to4
    "2002:a9fe:a9fe::1",
    "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1
    "2001:4860:4860::8888%eth0",  # a zone id: an interface chosen by the URL
]
EVERYTHING = rules.parse_networks(["0.0.0.0/0", "::/0"])


def url(address: str) -> str:
    host = f"[{address.replace('%', '%25')}]" if ":" in address else address
    return f"http://{host}:9/hook"  # port 9: discard, nothing answers should a POST go out


@pytest.mark.parametrize("form", NEVER_PUBLIC)
def test_the_egress_proxy_refuses_it_even_when_everything_is_exempt(form: str) -> None:
    assert rules.refusal(form, (), ()) is not None
    assert rules.refusal(form, EVERYTHING, ()) is not None


@pytest.mark.parametrize("form", NEVER_PUBLIC)
def test_a_webhook_url_with_it_is_a_422_at_registration(form: str) -> None:
    with pytest.raises(InvalidInput, match="not a public address"):
        check_url(url(form), Allow.of([]))


@pytest.mark.parametrize("form", NEVER_PUBLIC)
async def test_a_webhook_is_not_sent_to_it(form: str) -> None:
    """Refused before any connection is tried (a stored URL from before the rule, too)."""
    with pytest.raises(Refused):
        await post(url(form), b"{}", {}, Allow.of([]), hosts={}, timeout_s=2, max_response_bytes=1)


def test_the_egress_proxy_judges_a_wrapped_address_as_the_ipv4_one_it_reaches() -> None:
    service = rules.parse_networks(["10.5.0.0/16"])
    assert rules.refusal("2002:a05:1::", (), service) == "address 10.5.0.1 is on the service plane"
    assert rules.refusal("64:ff9b::808:808", (), ()) is None  # 8.8.8.8 through NAT64
    assert rules.refusal("::10.0.0.1", (), ()) == "address 10.0.0.1 is private"
    assert rules.refusal("64:ff9b:1::a00:1", (), ()) == (
        "address 64:ff9b:1::a00:1 is not global unicast IPv6 (2000::/3)"
    )


def test_webhooks_judge_a_wrapped_address_as_the_ipv4_one_it_reaches() -> None:
    """Wrapped public addresses pass; an operator's allowance (`webhook_allowed_hosts`, tests'
    loopback receivers, internal services) opens its addresses in any wrapping, no others."""
    for public in ("2002:808:808::", "64:ff9b::808:808", "2001:4860:4860::8888"):
        check_url(url(public), Allow.of([]))
    with pytest.raises(InvalidInput, match=r"10\.0\.0\.1 is private"):
        check_url(url("::10.0.0.1"), Allow.of([]))
    allow = Allow.of(["127.0.0.1", "fd12::/64"])
    for allowed in ("127.0.0.1", "::ffff:127.0.0.1", "64:ff9b::127.0.0.1", "fd12::7"):
        check_url(url(allowed), allow)
    with pytest.raises(InvalidInput, match="not a public address"):
        check_url(url("::169.254.169.254"), allow)
