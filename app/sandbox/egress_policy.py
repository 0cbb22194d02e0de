"""The operator's rules for egress by domain name, as the sandbox layer sees them.

Pure data: built from settings by `app.runner.episode.sandbox_caps`, carried on
`EgressPolicy.proxy`, used by `app.sandbox.egress_proxy` (the proxy container, per-task
networks, grants).
"""

from __future__ import annotations

from dataclasses import dataclass

PROXY_PORT = 3128


@dataclass(frozen=True)
class ProxyPolicy:
    """How `egress` sandboxes with `allow_domains` get out: only through the proxy."""

    image: str
    """Image of the proxy's container (any with python3 >= 3.11: the sandbox image will do)."""
    container: str
    """Name of the proxy's container, shared by the workers of one Docker host."""
    upstream_network: str
    """The proxy's own way out (a plain bridge); never a network of Postgres, Redis or the API."""
    control_dir: str
    """Host directory (the same path in the worker) holding the control socket and the code."""
    subnets: str
    """IPv4 CIDR the per-task /28 networks are carved from."""
    max_connections: int
    max_bytes: int
    ports: tuple[int, ...]
    exempt: tuple[str, ...] = ()
    """Private CIDRs the proxy may still connect to (an internal mirror; tests' upstreams)."""
    service: tuple[str, ...] = ()
    """CIDRs always refused, exemption or not (the service plane)."""
    hosts: tuple[tuple[str, str], ...] = ()
    """Fixed name -> address answers consulted before DNS."""
    manage_firewall: bool = True
    """Install the host rule that drops sandbox traffic to the host itself (needs root)."""
    ceiling: tuple[str, ...] | None = None
    """The operator's allow-list ceiling now: a task's names are checked against it again when
    its sandbox starts (a task queued before the ceiling narrowed is refused); None: not
    checked here (callers that built the names themselves)."""
    max_open: int = 256
    """Connections one task may hold open through the proxy at once."""
    max_open_total: int = 4096
    """Connections the proxy holds open at once over all tasks (its nofile limit follows)."""
    max_refusals: int = 1000
    """Refused connections after which a task's egress is cut off."""
    cpus: float = 1.0
    """CPU limit of the proxy's container."""
