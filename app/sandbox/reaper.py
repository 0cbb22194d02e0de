"""Finding and removing the sandboxes of dead workers and finished tasks (invariant 4).

Only containers carrying `sandhive.managed` *and* this deployment's
`sandhive.instance` label are ever listed, so nothing Sandhive did not create
(and nothing another deployment created) can be removed. Which of them must go
is the worker's decision (`app.worker.reaping`), which knows the tasks and the
live workers; this module only talks to Docker. Volumes are found the same way:
each sandbox's workdir volume carries its container's labels (`app.sandbox.policy`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from aiodocker.volumes import DockerVolume

from app.errors import SandboxError
from app.sandbox.docker import DockerHost, docker_errors
from app.sandbox.policy import MANAGED_LABEL

INSTANCE_LABEL = "sandhive.instance"
TASK_LABEL = "sandhive.task"
ATTEMPT_LABEL = "sandhive.attempt"
WORKER_LABEL = "sandhive.worker"
POOL_LABEL = "sandhive.pool"
"""On warm-pool sandboxes (`app.sandbox.pool`): no task label; they go when their worker dies."""
CREATED_LABEL = "sandhive.created_at"
"""When the worker labelled a task sandbox (UTC, ISO 8601, seconds): for operators reading
`docker ps` (RELIABILITY C1.8). Informational only: the reaper decides by task state and
worker liveness, never by age, so a wrong clock cannot get a live sandbox removed."""


@dataclass(frozen=True)
class Labelled:
    """One of our containers, by what its labels say."""

    id: str
    task_id: str
    attempt: int
    worker: str
    pooled: bool = False


def labels_for(
    instance: str, task_id: str, attempt: int, worker: str, *, now: datetime | None = None
) -> dict[str, str]:
    """The labels every task sandbox carries (`sandhive.managed` is added by the policy).

    Called right before the sandbox is made, so `now` (default: the clock) is its creation time.
    """
    created = (now or datetime.now(UTC)).astimezone(UTC).replace(microsecond=0)
    return {
        INSTANCE_LABEL: instance,
        TASK_LABEL: task_id,
        ATTEMPT_LABEL: str(attempt),
        WORKER_LABEL: worker,
        CREATED_LABEL: created.isoformat(),
    }


async def list_managed(
    host: DockerHost, instance: str, *, task_id: str | None = None
) -> list[Labelled]:
    """This deployment's sandboxes (of one task when given), running or not."""
    wanted = {MANAGED_LABEL: "1", INSTANCE_LABEL: instance}
    if task_id is not None:
        wanted[TASK_LABEL] = task_id
    filters = json.dumps({"label": [f"{key}={value}" for key, value in wanted.items()]})
    with docker_errors("list sandboxes"):
        containers = await host.api().containers.list(all=True, filters=filters)
    found = []
    for container in containers:
        labels = container["Labels"] or {}
        found.append(
            Labelled(
                id=container.id,
                task_id=labels.get(TASK_LABEL, ""),
                attempt=_int(labels.get(ATTEMPT_LABEL, "")),
                worker=labels.get(WORKER_LABEL, ""),
                pooled=labels.get(POOL_LABEL) == "1",
            )
        )
    return found


async def remove_all(host: DockerHost, doomed: Iterable[Labelled]) -> list[str]:
    """Force-remove each container; the ids actually removed (a failure is left for next time)."""
    removed = []
    for item in doomed:
        try:
            await host.remove_container(item.id)
        except SandboxError:
            continue
        removed.append(item.id)
    return removed


async def remove_earlier_attempts(
    host: DockerHost, instance: str, task_id: str, attempt: int
) -> list[str]:
    """Before attempt N starts, the sandboxes of attempts below N go (on this Docker host)."""
    stale = [c for c in await list_managed(host, instance, task_id=task_id) if c.attempt < attempt]
    return await remove_all(host, stale)


async def remove_orphan_volumes(host: DockerHost, instance: str) -> list[str]:
    """This deployment's volumes that no container uses any more; the names removed.

    A workdir volume goes with its container (`docker rm -v`, or the daemon itself when the
    sandbox's deadline ends it); one stays behind only when its container went some other
    way (`docker rm` without -v, a daemon crash mid-removal). Only unreferenced ("dangling")
    volumes are listed, and the daemon refuses to remove one in use (409), so a sandbox's
    workdir is never taken from it; such a refusal is left for next time.
    """
    wanted = [f"{MANAGED_LABEL}=1", f"{INSTANCE_LABEL}={instance}"]
    with docker_errors("list sandbox volumes"):
        listed = await host.api().volumes.list(  # type: ignore[no-untyped-call]
            filters={"label": wanted, "dangling": ["true"]}
        )
    removed = []
    for volume in listed.get("Volumes") or []:
        name = str(volume["Name"])
        try:
            with docker_errors(f"remove volume {name}"):
                await DockerVolume(host.api(), name).delete()  # type: ignore[no-untyped-call]
        except SandboxError:
            continue
        removed.append(name)
    return removed


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0
