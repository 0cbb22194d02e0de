"""How the suite runs in parallel (`make test`: `pytest -n 3`, pytest-xdist).

A unit of work is a test module, so its module-scoped fixtures (a built image, a sandbox,
a model server) are made once, on one worker. Modules that share something of the host
that cannot be shared at once form one named group in `GROUPS` and run one after another
on one worker. The units listed in `LONGEST_FIRST` start first, so that the run does not
end waiting on one of them alone. Every worker has its own Postgres database (named after
its pid) and its own Redis databases (tests/support/settings.py); Docker objects are named
or labelled per test.

The grouping is a scheduler of our own (`UnitScheduling`, installed by tests/conftest.py)
rather than xdist's `xdist_group` marks: those rename each test's node id, which pytest
9.2 no longer lets a plugin do, so `--dist loadgroup` silently spread every group.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling

HOST_NETWORK = "host-network"
"""Tests that change or measure the host itself: the egress proxy's host-wide firewall chain
(`SHV-IN-proxied`, flushed and removed by its tests), the compose deployment's
`egress-firewall`, and the attack tests that measure the host's free memory, its processes
and its listeners."""

CATALOGUE_IMAGE = "catalogue-image"
"""The modules that build and remove the `sandhive-test-extra` catalogue image."""

GROUPS: dict[str, tuple[str, ...]] = {
    HOST_NETWORK: (
        "tests/security/test_sandbox_attacks.py",
        "tests/e2e/test_compose.py",
        "tests/security/test_egress_proxy.py",
        "tests/security/test_egress.py",
        "tests/security/test_egress_domains.py",
        "tests/e2e/test_browser_network_blocked.py",
    ),
    CATALOGUE_IMAGE: ("tests/images/test_images_worker.py", "tests/images/test_images_review.py"),
}
"""Named groups and their modules (paths from the checkout's root)."""

LONGEST_FIRST: tuple[str, ...] = (
    HOST_NETWORK,
    "tests/worker/test_several_hosts.py",
    "tests/e2e/test_faults_load.py",
    "tests/e2e/test_faults_worker_killed.py",
    "tests/e2e/test_faults_cancel_timeout.py",
    "tests/security/test_fuzz.py",
    "tests/e2e/test_experiment_cli.py",
    "tests/security/test_connections.py",
    "tests/e2e/test_mcp.py",
    "tests/e2e/test_experiment_e2e.py",
    "tests/episodes/test_scoring_lease.py",
    "tests/e2e/test_first_use.py",
    "tests/e2e/test_browser_page.py",
    "tests/e2e/test_browser_experiments.py",
    "tests/episodes/test_deferred_rewards.py",
    "tests/e2e/test_upgrade.py",
    "tests/real_llm/test_real_llm.py",
)
"""Units that take longest, longest first (from `pytest --durations`); the others keep their
collection order after them."""

_GROUP_OF = {module: group for group, modules in GROUPS.items() for module in modules}


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module's group, or else its module."""
    module = nodeid.split("::", 1)[0]
    return _GROUP_OF.get(module, module)


def rank(nodeid: str) -> int:
    """Where a test's unit starts: the listed ones first, in their order, then the others."""
    unit = unit_of(nodeid)
    return LONGEST_FIRST.index(unit) if unit in LONGEST_FIRST else len(LONGEST_FIRST)


class UnitScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with our units: whole modules, or whole named groups, handed
    out in collection order (which tests/conftest.py sorts longest first)."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # keep our order, not "most tests first"

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)
