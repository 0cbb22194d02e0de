"""How the suite runs in parallel (`make test`: pytest-xdist, `--dist loadgroup`).

Each module is one unit of work, so its module-scoped fixtures (a built image, a sandbox, a
model server) are made once, on one worker. Modules that share something of the host that
cannot be shared at once are put in one named group with
`pytestmark = pytest.mark.xdist_group(NAME)`, and so run one after another on one worker.
Every worker has its own Postgres database (named after its pid) and its own Redis
databases (tests/support/settings.py); Docker objects are named or labelled per test.
"""

from __future__ import annotations

HOST_NETWORK = "host-network"
"""Tests that change or measure the host itself: the egress proxy's host-wide firewall chain
(`SHV-IN-proxied`, flushed and removed by its tests), the compose deployment's
`egress-firewall`, and the attack tests that measure the host's free memory, its processes
and its listeners."""

CATALOGUE_IMAGE = "catalogue-image"
"""The modules that build and remove the `sandhive-test-extra` catalogue image."""

LONGEST_FIRST: tuple[str, ...] = ()
"""Units of work (a group's name or a module's path) that take longest, longest first: they
start first, so that the run does not end waiting on one of them alone. From
`pytest --durations`; a unit not listed keeps its place in collection order."""


def unit_of(nodeid: str, group: str | None) -> str:
    """The unit of work a test belongs to: its named group, or else its module."""
    return group if group is not None else nodeid.split("::", 1)[0]


def rank(unit: str) -> int:
    """Where a unit starts: the listed ones first, in their order, then all the others."""
    return LONGEST_FIRST.index(unit) if unit in LONGEST_FIRST else len(LONGEST_FIRST)
