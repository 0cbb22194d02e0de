"""`sandhive admin`: the operator's commands (workers, drain, requeue, fail, prune,
egress-firewall).

Each command makes one call of `app.services.admin.service` with the process's resources
open (`cli_common.call`: the exit codes every command shares) and prints the result.
Imported by app.cli.main only.
"""

from __future__ import annotations

from typing import Annotated

import typer

from app.cli.common import call
from app.config import Settings

admin_cli = typer.Typer(
    help="Operate a deployment: workers, drain, requeue, fail, prune, egress-firewall.",
    no_args_is_help=True,
)


@admin_cli.command("workers")
def workers() -> None:
    """Live workers (from their heartbeats): name, host, pid, busy/slots, draining, and the
    catalogue images their daemon has (docs/images.md)."""
    from app.services.admin import service as admin

    found = call(lambda res: admin.list_workers(res.redis))
    typer.echo("worker\thost\tpid\tbusy/slots\tstate\timages")
    for item in found:
        state = "draining" if item.draining else "active"
        images = ",".join(item.images) or "-"
        row = f"{item.name}\t{item.host}\t{item.pid}\t{item.busy}/{item.slots}\t{state}"
        typer.echo(f"{row}\t{images}")


@admin_cli.command("drain")
def drain(
    worker: Annotated[str, typer.Argument(help="The worker's name (see `workers`).")],
) -> None:
    """Stop a worker taking tasks; it exits after its running ones (SIGTERM's grace applies)."""
    from app.services.admin import service as admin

    call(lambda res: admin.drain(res.redis, worker))
    typer.echo(f"draining {worker}: it stops claiming at its next heartbeat")


@admin_cli.command("requeue")
def requeue(task_id: Annotated[str, typer.Argument(help="The task's id (tsk_...).")]) -> None:
    """Put a queued task, or a running one whose worker is gone, on the queue again (a
    running task on a live worker is refused: use `fail` or `drain`)."""
    from app.services.admin import service as admin

    was = call(lambda res: admin.requeue(res.sessions, res.redis, task_id))
    typer.echo(f"requeued {task_id} (was {was})")


@admin_cli.command("fail")
def fail(
    task_id: Annotated[str, typer.Argument(help="The task's id (tsk_...).")],
    reason: Annotated[str, typer.Option(help="Why, stored in the task's error.")] = "",
) -> None:
    """End a queued or running task as failed (sandbox_error) now."""
    from app.services.admin import service as admin

    call(lambda res: admin.fail(res.sessions, res.redis, task_id, reason))
    typer.echo(f"failed {task_id}")


@admin_cli.command("prune")
def prune(
    task_days: Annotated[
        float | None, typer.Option(help="Delete tasks finished more than this many days ago.")
    ] = None,
    artifact_days: Annotated[
        float | None,
        typer.Option(help="Delete artifacts of tasks finished more than this many days ago."),
    ] = None,
) -> None:
    """Delete old finished tasks and artifacts (defaults: the retention settings)."""
    from app.services.admin import service as admin

    settings = Settings()
    tasks = settings.task_retention_days if task_days is None else task_days
    outputs = settings.artifact_retention_days if artifact_days is None else artifact_days
    pruned = call(
        lambda res: admin.prune(res.sessions, task_days=tasks, artifact_days=outputs), settings
    )
    typer.echo(f"pruned {pruned.tasks} tasks and {pruned.artifacts} artifacts")


@admin_cli.command("egress-firewall")
def egress_firewall(
    soft: Annotated[
        bool,
        typer.Option(
            help="Exit 0 even when the rules cannot be installed (no marker is left, so "
            "workers refuse egress by name and run the rest): compose's one-shot."
        ),
    ] = False,
) -> None:
    """Install the Docker host's rules for egress by domain name (iptables and ip6tables,
    idempotent), write the marker workers that cannot install them check, and exit:
    compose's `egress-firewall` one-shot, run on the host's network with NET_ADMIN
    (docs/network.md). Does nothing when proxied egress is off."""
    import asyncio

    from app.cli import common as cli_common
    from app.errors import SandboxError
    from app.sandbox import host_rules
    from app.sandbox.egress_proxy import install_host_rules, proxy_policy

    settings = Settings()
    if not (settings.sandbox_egress_enabled and settings.sandbox_egress_proxy):
        host_rules.remove_marker(settings.sandbox_egress_proxy_dir)
        typer.echo("egress by domain name is off: no host rules to install")
        return
    try:
        bridge = asyncio.run(install_host_rules(proxy_policy(settings)))
    except (SandboxError, OSError) as exc:
        message = exc.message if isinstance(exc, SandboxError) else repr(exc)
        if not soft:
            cli_common.fail(message)
        typer.echo(
            f"error: egress host rules NOT installed: {message}; tasks with allow_domains fail"
            " (sandbox_error) until this runs again and succeeds, other tasks run",
            err=True,
        )
        return
    marker = host_rules.marker_path(settings.sandbox_egress_proxy_dir)
    typer.echo(
        f"egress host rules in place (task bridges shvp+, upstream bridge {bridge}; {marker})"
    )
