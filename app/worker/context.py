"""What every part of a worker shares: the process's resources, its Docker host and runner.

Built once by `Worker.run`; heartbeat, reconciliation, reaping, readiness and
attempts all read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.resources import Resources
from app.runner.episode import Runner
from app.sandbox.docker import DockerHost


@dataclass(frozen=True)
class WorkerContext(Resources):
    """The process's resources, plus what only a worker has."""

    runner: Runner
    """Runs every attempt's episode, over this worker's Docker host and warm pool."""
    name: str
    instance: str

    @classmethod
    def of(cls, res: Resources, runner: Runner, name: str, instance: str) -> WorkerContext:
        return cls(res.settings, res.engine, res.sessions, res.redis, runner, name, instance)

    @property
    def docker(self) -> DockerHost:
        return self.runner.docker
