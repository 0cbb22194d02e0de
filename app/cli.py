"""The `sandhive` command: parse arguments, build Settings, call one entry point each.

serve · worker · migrate · run · demo · image build. Nothing else lives here.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from app.config import Settings

if TYPE_CHECKING:
    from app.llm.openai import OpenAIChatModel
    from app.local import LocalRun

cli = typer.Typer(help="Sandhive: LLM agents in disposable Docker sandboxes.", no_args_is_help=True)
image_cli = typer.Typer(help="The sandbox image.", no_args_is_help=True)
cli.add_typer(image_cli, name="image")
console = Console()
ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    cli()


@cli.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8000,
) -> None:
    """Run the HTTP API (FastAPI under uvicorn)."""
    import uvicorn

    from app.api.app import create_app

    uvicorn.run(create_app(Settings()), host=host, port=port, log_level="info")


@cli.command()
def worker(
    burst: Annotated[bool, typer.Option(help="Exit once the queue is empty.")] = False,
    concurrency: Annotated[int | None, typer.Option(help="Parallel tasks (slots).")] = None,
) -> None:
    """Run a worker: take tasks from Redis and run each in its own sandbox."""
    from app.worker.pool import Worker

    settings = Settings()
    if concurrency is not None:
        settings = settings.model_copy(update={"worker_concurrency": concurrency})
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    async def _main() -> None:
        pool = Worker(settings)
        pool.install_signal_handlers()
        await pool.run(burst=burst)

    asyncio.run(_main())


@cli.command()
def migrate(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
) -> None:
    """Bring the database schema to a revision (Alembic upgrade)."""
    from alembic import command
    from alembic.config import Config

    config = Config(str(_find("alembic.ini")))
    config.set_main_option("script_location", str(_find("migrations")))
    config.set_main_option("sqlalchemy.url", Settings().database_url.replace("%", "%%"))
    command.upgrade(config, revision)
    console.print(f"database at {revision}")


@cli.command()
def run(
    prompt: Annotated[str, typer.Option(help="The task for the agent.")],
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name.")] = None,
    api_key: Annotated[str | None, typer.Option(help="API key (or SANDHIVE_LLM_API_KEY).")] = None,
    max_steps: Annotated[int, typer.Option(min=1)] = 100,
    temperature: Annotated[float, typer.Option(min=0, max=2)] = 1.0,
    max_tokens_per_call: Annotated[int, typer.Option(min=1)] = 8192,
    tools_profile: Annotated[str, typer.Option(help="standard or reference.")] = "standard",
    input_dir: Annotated[Path | None, typer.Option(help="Folder copied to /testbed/input.")] = None,
    output_dir: Annotated[Path, typer.Option(help="Where run folders go.")] = Path("output"),
) -> None:
    """Run one task locally in a sandbox, with no Postgres or Redis."""
    from app.llm.openai import OpenAIChatModel
    from app.local import LocalRun

    settings = Settings()
    url = base_url or settings.llm_base_url
    name = model or settings.llm_model
    if not url or not name:
        console.print("[red]no model: pass --base-url and --model (or try `sandhive demo`)[/]")
        raise typer.Exit(2)
    if tools_profile not in ("standard", "reference"):
        raise typer.BadParameter("tools profile must be standard or reference")
    key = api_key if api_key is not None else settings.llm_api_key.get_secret_value()
    chat = OpenAIChatModel(
        base_url=url,
        api_key=key,
        model=name,
        temperature=temperature,
        max_tokens=max_tokens_per_call,
        timeout_s=settings.llm_timeout_s,
        max_retries=settings.llm_max_retries,
        backoff_s=settings.llm_retry_backoff_s,
    )
    job = LocalRun(
        prompt=prompt,
        max_steps=max_steps,
        tools_profile=tools_profile,
        output_root=output_dir,
        inputs=_read_inputs(input_dir),
    )
    _run_local(settings, chat, job)


@cli.command()
def demo(
    output_dir: Annotated[Path, typer.Option(help="Where run folders go.")] = Path("output"),
) -> None:
    """Run a canned task against the built-in SCRIPTED model (no real LLM needed)."""
    from app.llm.openai import OpenAIChatModel
    from app.llm.scripted import DEMO_MODEL, DEMO_PROMPT, DEMO_SCRIPT, ScriptedLLMServer
    from app.local import LocalRun

    console.print("[bold yellow]SCRIPTED DEMO[/]: the 'model' is a fixed script, not an LLM.")
    with ScriptedLLMServer({DEMO_MODEL: DEMO_SCRIPT}) as server:
        chat = OpenAIChatModel(
            base_url=server.base_url,
            api_key="",
            model=DEMO_MODEL,
            temperature=None,
            max_tokens=None,
        )
        job = LocalRun(prompt=DEMO_PROMPT, output_root=output_dir)
        _run_local(Settings(), chat, job)


@image_cli.command("build")
def image_build(
    offline: Annotated[
        bool, typer.Option(help="First build the base from Debian packages (no registry).")
    ] = False,
    tag: Annotated[
        str | None, typer.Option(help="Image tag (default SANDHIVE_SANDBOX_IMAGE).")
    ] = None,
    base_image: Annotated[str | None, typer.Option(help="Override ARG BASE_IMAGE.")] = None,
) -> None:
    """Build the sandbox image from Dockerfile.sandbox (quick when nothing changed)."""
    from app.sandbox.docker import DockerHost
    from app.sandbox.image import (
        OFFLINE_BASE,
        build_offline_base,
        build_sandbox_image,
        find_dockerfile,
    )

    if offline:
        build_offline_base(OFFLINE_BASE)
        base_image = base_image or OFFLINE_BASE
    target = tag or Settings().sandbox_image

    async def _build() -> None:
        async with DockerHost() as host:
            await build_sandbox_image(
                host,
                tag=target,
                dockerfile=find_dockerfile(),
                base_image=base_image,
                on_log=lambda line: console.print(line, markup=False, highlight=False),
            )

    asyncio.run(_build())
    console.print(f"built {target}")


def _run_local(settings: Settings, chat: OpenAIChatModel, job: LocalRun) -> None:
    from app.local import run_local

    async def _go() -> None:
        try:
            result, folder = await run_local(settings, chat, job, console)
        finally:
            await chat.aclose()
        outcome = result.outcome
        console.rule("finished")
        console.print(
            f"finish_reason: [bold]{outcome.finish_reason}[/] ({len(outcome.steps)} steps)"
        )
        if outcome.error:
            console.print(f"[red]error:[/] {outcome.error}")
        answer = result.answer(settings.answer_max_bytes)
        if answer is not None:
            console.print(f"answer: {answer}")
        console.print(f"outputs: {folder}")

    asyncio.run(_go())


def _read_inputs(folder: Path | None) -> list[tuple[str, bytes]]:
    if folder is None:
        return []
    if not folder.is_dir():
        raise typer.BadParameter(f"{folder} is not a directory")
    return [
        (path.relative_to(folder).as_posix(), path.read_bytes())
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not path.is_symlink()
    ]


def _find(name: str) -> Path:
    for candidate in (Path.cwd() / name, ROOT / name):
        if candidate.exists():
            return candidate
    raise typer.BadParameter(f"cannot find {name} (run from the Sandhive checkout)")
