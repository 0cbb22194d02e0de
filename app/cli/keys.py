"""`sandhive keys create|list|revoke`: API keys, straight against Postgres (docs/security.md)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from app.cli.common import call

keys_cli = typer.Typer(help="API keys: create, list, revoke.", no_args_is_help=True)
err_console = Console(stderr=True)


@keys_cli.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="The tenant the key acts as.")],
    name: Annotated[str, typer.Option(help="A note to recognise the key by.")] = "",
) -> None:
    """Create an API key. It is printed once (alone on stdout) and stored only as a hash."""
    from app.services import keys

    created = call(lambda res: keys.create_key(res.sessions, tenant, name))
    err_console.print(f"created {created.id} for tenant {created.tenant}; keep the key now:")
    typer.echo(created.key)


@keys_cli.command("list")
def keys_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
) -> None:
    """Every key's id, tenant, name and dates (never the keys themselves)."""
    from app.services import keys

    for item in call(lambda res: keys.list_keys(res.sessions, tenant)):
        revoked = f"revoked {item.revoked_at:%Y-%m-%d %H:%M}" if item.revoked_at else "active"
        typer.echo(
            f"{item.id}\t{item.tenant}\t{item.created_at:%Y-%m-%d %H:%M}\t{revoked}\t{item.name}"
        )


@keys_cli.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="The key's id (key_...).")]) -> None:
    """Revoke a key: requests with it answer 401 from now on."""
    from app.services import keys

    item = call(lambda res: keys.revoke_key(res.sessions, key_id))
    typer.echo(f"revoked {item.id} (tenant {item.tenant})")
