"""`sandhive mcp`: serve Sandhive's tasks as MCP tools (the server is app/clients/mcp_server.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from app.cli.common import fail


def mcp(
    transport: Annotated[str, typer.Option(help="`stdio` or `http` (streamable HTTP).")] = "stdio",
    server: Annotated[
        str, typer.Option(envvar="SANDHIVE_URL", help="The Sandhive API to call.")
    ] = "http://127.0.0.1:8000",
    api_key: Annotated[
        str | None,
        typer.Option(envvar="SANDHIVE_API_KEY", help="Its API key (stdio; HTTP uses the bearer)."),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind (http).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind (http).")] = 8765,
) -> None:
    """Serve Sandhive's tasks as MCP tools to an agent (docs/mcp.md)."""
    from app.clients.mcp_server import Upstream, serve

    if transport not in ("stdio", "http"):
        fail("--transport must be `stdio` or `http`")
    if transport == "http":
        api_key = None  # never lent out: each HTTP client's bearer token is its key
    serve(Upstream(server, api_key, "stdio" if transport == "stdio" else "http"), host, port)
