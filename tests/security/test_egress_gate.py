"""The worker's side of egress by name, without Docker: what it asks the daemon and the proxy for.

The container body, the host rules and the grant's refused addresses are plain data; the
ceiling is re-checked before anything is created. The same paths run against Docker in
test_egress_proxy.py.
"""

from __future__ import annotations

import ipaddress

import aiodocker
import pytest

from app.errors import SandboxError
from app.sandbox.egress_policy import ProxyPolicy
from app.sandbox.egress_proxy import (
    INPUT_CHAIN,
    ProxyGate,
    bridge_of,
    firewall_rules,
    host_addresses,
    proxy_container,
    upstream_bridge,
    upstream_rule,
)
from app.sandbox.policy import EgressPolicy, SandboxConfig, container_config

POLICY = ProxyPolicy(
    image="img",
    container="proxy",
    upstream_network="sandhive-egress-out",
    control_dir="/run/x",
    subnets="10.213.0.0/16",
    max_connections=10,
    max_bytes=100,
    ports=(443,),
    ceiling=("pypi.org", "*.example.com"),
    max_open_total=1000,
    cpus=0.5,
)


def no_docker() -> aiodocker.Docker:
    raise AssertionError("the ceiling must be checked before Docker is asked anything")


async def test_names_outside_the_ceiling_now_are_refused_before_anything_is_made() -> None:
    gate = ProxyGate(no_docker)
    with pytest.raises(SandboxError, match=r"ceiling.*narrowed.*files\.pypi\.org") as caught:
        await gate.open(POLICY, ("a.example.com", "files.pypi.org"), {})
    assert caught.value.details == {"outside": ["files.pypi.org"]}


def test_the_proxy_container_is_capped_so_one_task_cannot_take_it_down() -> None:
    body = proxy_container(POLICY)
    host = body["HostConfig"]
    assert body["Cmd"][:6] == ["python3", "-E", "-s", "-S", "-m", "egress"]
    assert body["Cmd"][-2:] == ["--max-open", "1000"]
    assert body["User"] not in ("", "0", "root", "0:0")
    assert host["Ulimits"] == [{"Name": "nofile", "Soft": 2256, "Hard": 2256}]
    assert host["MemorySwap"] == host["Memory"]
    assert host["NanoCpus"] == 500_000_000
    assert host["LogConfig"]["Config"]["max-size"] == "10m"
    sysctls = host["Sysctls"]
    assert sysctls["net.ipv4.ip_forward"] == "0"
    assert sysctls["net.ipv6.conf.all.disable_ipv6"] == "1"
    assert sysctls["net.ipv6.conf.default.disable_ipv6"] == "1"
    assert sysctls["net.ipv4.conf.all.arp_ignore"] == "1"
    assert sysctls["net.ipv4.conf.all.rp_filter"] == "1"


def test_the_host_rules_cover_task_bridges_and_new_connections_from_the_upstream() -> None:
    assert f"-A {INPUT_CHAIN} -i shvp+ -j DROP" in firewall_rules()
    bridge = upstream_bridge("sandhive-egress-out")
    assert len(bridge) <= 15  # Linux's IFNAMSIZ
    assert not bridge.startswith("shvp")  # not a task bridge (those drop everything)
    assert upstream_rule(bridge) == [
        "-i", bridge, "-m", "conntrack", "--ctstate", "NEW,INVALID", "-j", "DROP",
    ]  # fmt: skip
    named = {"Id": "abc", "Options": {"com.docker.network.bridge.name": bridge}}
    assert bridge_of(named) == bridge
    assert bridge_of({"Id": "0123456789abcdef", "Options": {}}) == "br-0123456789ab"


def test_every_gateway_and_the_hosts_own_addresses_are_refused_destinations() -> None:
    networks = [
        {"IPAM": {"Config": [{"Subnet": "172.17.0.0/16", "Gateway": "172.17.0.1"}]}},
        {"IPAM": {"Config": [{"Subnet": "fd00::/64", "Gateway": "fd00::1"}]}},
        {"IPAM": {"Config": None}},
        {"IPAM": {"Config": [{"Subnet": "10.9.0.0/24"}]}},
    ]
    found = host_addresses(networks)
    assert {"172.17.0.1", "fd00::1", "127.0.0.1"} <= set(found)
    assert all(ipaddress.ip_address(a) for a in found)


def proxied(proxy: ProxyPolicy | None) -> SandboxConfig:
    egress = EgressPolicy(network="n", bridge="b", proxy=proxy)
    return SandboxConfig(image="img", labels={}, network="egress", egress=egress)


def test_a_proxied_sandbox_has_no_ipv6_and_others_are_unchanged() -> None:
    sysctls = container_config(proxied(POLICY))["HostConfig"]["Sysctls"]
    assert sysctls == {
        "net.ipv6.conf.all.disable_ipv6": "1",
        "net.ipv6.conf.default.disable_ipv6": "1",
    }
    assert "Sysctls" not in container_config(proxied(None))["HostConfig"]
