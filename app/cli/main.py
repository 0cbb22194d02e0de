"""The `sandhive` command: its entry point, and the commands that start the service.

serve · worker · migrate · demo live here; every other command group has a module of its own
beside this one (run, keys, mcp, image, admin, experiment), registered below in help order.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from app.cli.admin import admin_cli
from app.cli.common import fail, find_in_checkout, warn_without_model
from app.cli.experiment import experiment_cli
from app.cli.image import image_cli
from app.cli.keys import keys_cli
from app.cli.mcp import mcp
from app.cli.run import run, run_local
from app.config import Settings

cli = typer.Typer(help="Sandhive: LLM agents in disposable Docker sandboxes.", no_args_is_help=True)
cli.add_typer(image_cli, name="image")  # the image catalogue: app/cli/image.py (docs/images.md)
cli.add_typer(keys_cli, name="keys")  # app/cli/keys.py (docs/security.md)
cli.add_typer(admin_cli, name="admin")  # operations: app/cli/admin.py (docs/operations.md)
cli.add_typer(experiment_cli, name="experiment")  # app/cli/experiment.py (docs/experiments.md)
console = Console()

if TYPE_CHECKING:
    from collections.abc import Callable

    from app.clients import demo as demo_client


def main() -> None:
    cli()


@cli.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8000,
) -> None:
    """Run the HTTP API (FastAPI under uvicorn)."""
    import uvicorn

    from app import logs
    from app.api.app import create_app
    from app.api.server import server_options

    settings = Settings()
    logs.setup(settings.log_format, settings.log_level)
    warn_without_model(settings, "serve")
    # Head deadline, connection cap, WebSocket message cap: app/api/server.py.
    uvicorn.run(
        create_app(settings), host=host, port=port, log_level="info", **server_options(settings)
    )


@cli.command()
def worker(
    burst: Annotated[bool, typer.Option(help="Exit once the queue is empty.")] = False,
    concurrency: Annotated[int | None, typer.Option(help="Parallel tasks (slots).")] = None,
) -> None:
    """Run a worker: take tasks from Redis and run each in its own sandbox."""
    from app.worker.health import Readiness
    from app.worker.pool import Worker

    settings = Settings()
    if concurrency is not None:
        settings = settings.model_copy(update={"worker_concurrency": concurrency})
    from app import logs, metrics
    from app.scripted.profile import serving

    logs.setup(settings.log_format, settings.log_level)
    warn_without_model(settings, "worker")
    readiness = Readiness()
    if settings.worker_metrics_port:  # /metrics, /healthz and /readyz
        metrics.serve(settings.worker_metrics_port, readiness=readiness.report)

    async def _main(settings: Settings) -> None:
        pool = Worker(settings, readiness)
        pool.install_signal_handlers()
        await pool.run(burst=burst)

    with (
        serving(settings) as served,
        asyncio.Runner(loop_factory=_loop_factory(settings)) as runner,
    ):
        runner.run(_main(served))  # served: the `scripted` profile's server, when it is on
    # Exiting now: spare the interpreter's last garbage collection a walk over every object,
    # a few hundred ms on a busy host and otherwise most of an idle worker's exit.
    gc.freeze()


def _loop_factory(settings: Settings) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop unless told otherwise: None is asyncio.Runner's own (the standard library's)."""
    if settings.worker_event_loop == "asyncio":
        return None
    import uvloop

    return uvloop.new_event_loop


@cli.command()
def migrate(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
) -> None:
    """Bring the database schema to a revision (Alembic upgrade)."""
    from alembic import command
    from alembic.config import Config

    from app.cli.common import UNREACHABLE, unreachable_postgres

    config = Config(str(find_in_checkout("alembic.ini")))
    config.set_main_option("script_location", str(find_in_checkout("migrations")))
    config.set_main_option("sqlalchemy.url", Settings().database_url.replace("%", "%%"))
    try:
        command.upgrade(config, revision)
    except UNREACHABLE as exc:
        fail(unreachable_postgres(exc))
    console.print(f"database at {revision}")


cli.command()(run)  # `sandhive run`: app/cli/run.py


@cli.command()
def demo(
    output_dir: Annotated[Path, typer.Option(help="Where run folders go.")] = Path("output"),
    api_url: Annotated[
        str, typer.Option(help="A running service to submit to (else the demo runs locally).")
    ] = "http://127.0.0.1:8000",
    api_key: Annotated[
        str | None, typer.Option(envvar="SANDHIVE_API_KEY", help="Its API key.")
    ] = None,
    local: Annotated[bool, typer.Option(help="Run locally even if a service answers.")] = False,
) -> None:
    """Run a canned task against the built-in SCRIPTED model (no real LLM needed).

    Submitted to the running service when it answers and offers the `scripted` profile
    (the run then appears in the page), else run locally in a sandbox of its own.
    """
    from pydantic import SecretStr

    from app.clients import demo as demo_client
    from app.scripted import DEMO_MODEL, DEMO_PROMPT, DEMO_SCRIPT, ScriptedLLMServer

    console.print("[bold yellow]SCRIPTED DEMO[/]: the 'model' is a fixed script, not an LLM.")
    service, why_not = (None, "--local") if local else demo_client.find_service(api_url, api_key)
    if service is not None:
        _demo_through(service, DEMO_PROMPT)
        return
    console.print(f"running locally ({why_not})")
    with ScriptedLLMServer({DEMO_MODEL: DEMO_SCRIPT}) as server:
        settings = Settings().model_copy(
            update={
                "llm_kind": "openai",
                "llm_base_url": server.base_url,
                "llm_api_key": SecretStr(""),
                "llm_model": DEMO_MODEL,
                "llm_profiles_file": None,
            }
        )
        run_local(settings, {"prompt": DEMO_PROMPT}, [], output_dir)


def _demo_through(service: demo_client.Service, prompt: str) -> None:
    from app.clients import demo as demo_client

    task_id = demo_client.submit(service, prompt, "demo")
    console.print(f"submitted {task_id}: watch it at {service.url}/#/tasks/{task_id}")
    task = demo_client.wait(service, task_id)
    console.print(f"status: [bold]{task['status']}[/] ({task.get('finish_reason')})")
    if task.get("answer") is not None:
        console.print(f"answer: {task['answer']}")


cli.command()(mcp)  # `sandhive mcp`: app/cli/mcp.py (docs/mcp.md)
