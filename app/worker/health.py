"""The worker's readiness: Postgres, Redis and Docker, checked in the background.

A worker's `/readyz` (served with its metrics, `app.metrics.serve`) must not
wait on a dead daemon in the HTTP thread, and that thread cannot use the
worker's event-loop clients anyway. So the worker's loop checks every backend
every `worker_ready_check_s` and stores the results here; `/readyz` only reads
them. A worker whose Docker daemon went away turns not ready within one
interval, and ready again once the daemon answers; meanwhile it claims no task
(`docker_lost`), which would only end as a sandbox error, and leaves them to
workers that can run them. A worker that does not install the host rules of egress
by domain name itself also reports `egress`: whether their marker confirms them
(`app.sandbox.host_rules`); without it only tasks with `allow_domains` fail.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable

from sqlalchemy import text

from app.config import Settings
from app.errors import SandboxError
from app.sandbox.egress_proxy import proxy_policy
from app.worker.context import WorkerContext

CHECK_TIMEOUT_S = 5.0
BACKENDS = ("postgres", "redis", "docker")
log = logging.getLogger(__name__)


class Readiness:
    """The latest result per backend: "ok", or what went wrong; "unchecked" until the first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checks = dict.fromkeys(BACKENDS, "unchecked")

    def report(self) -> dict[str, str]:
        """A copy, safe to call from the metrics server's threads."""
        with self._lock:
            return dict(self._checks)

    def docker_lost(self) -> bool:
        """The last Docker check failed: claiming now would only fail tasks as sandbox_error."""
        with self._lock:
            return self._checks["docker"] not in ("ok", "unchecked")

    def record(self, results: dict[str, str]) -> None:
        with self._lock:
            changed = {k: v for k, v in results.items() if self._checks.get(k) != v}
            self._checks.update(results)
        for name, state in changed.items():
            level = logging.INFO if state == "ok" else logging.WARNING
            log.log(level, "readiness of %s: %s", name, state)

    async def check(self, ctx: WorkerContext) -> None:
        """Probe every backend at once, each bounded by CHECK_TIMEOUT_S, and record the results."""
        probes = (_ping_postgres(ctx), ctx.redis.ping(), ctx.docker.ping())
        results = await asyncio.gather(*(_probe(p) for p in probes))
        found = dict(zip(BACKENDS, results, strict=True))
        if checks_marker(ctx.settings):
            found["egress"] = await _egress_rules(ctx)
        self.record(found)


def checks_marker(settings: Settings) -> bool:
    """Egress by domain name is on and someone else installs its host rules (compose)."""
    s = settings
    return s.sandbox_egress_enabled and s.sandbox_egress_proxy and not s.sandbox_egress_firewall


async def _egress_rules(ctx: WorkerContext) -> str:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            await ctx.docker.egress_gate.confirm_host_rules(proxy_policy(ctx.settings))
    except TimeoutError:
        return f"no answer within {CHECK_TIMEOUT_S:.0f} s"
    except SandboxError as exc:
        return f"failed: {exc.message} (tasks with allow_domains fail; the others run)"
    return "ok"


async def _probe(probe: Awaitable[object]) -> str:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            await probe
    except TimeoutError:
        return f"no answer within {CHECK_TIMEOUT_S:.0f} s"
    except Exception as exc:  # whatever the driver raised, the backend is not usable
        return f"failed: {type(exc).__name__}"
    return "ok"


async def _ping_postgres(ctx: WorkerContext) -> None:
    async with ctx.sessions() as session:
        await session.execute(text("SELECT 1"))
