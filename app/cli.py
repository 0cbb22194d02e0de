"""The `sandhive` command: parse arguments, build Settings, call one entry point each.

serve · worker · migrate · run · demo · image build. Nothing else lives here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.console import Console

from app.config import Settings

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from app.config import LLMProfile
    from app.llm.profiles import HTTPChatModel
    from app.local import LocalRun
    from app.schemas import PromptSpec

cli = typer.Typer(help="Sandhive: LLM agents in disposable Docker sandboxes.", no_args_is_help=True)
image_cli = typer.Typer(help="The sandbox image.", no_args_is_help=True)
cli.add_typer(image_cli, name="image")
keys_cli = typer.Typer(help="API keys: create, list, revoke.", no_args_is_help=True)
cli.add_typer(keys_cli, name="keys")
# Operations (issue 8): `sandhive admin ...` lives in app/admin_cli.py.
from app.admin_cli import admin_cli  # noqa: E402

cli.add_typer(admin_cli, name="admin")
console = Console()
err_console = Console(stderr=True)
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

    from app import logs
    from app.api.app import create_app
    from app.api.server import server_options

    settings = Settings()
    logs.setup(settings.log_format, settings.log_level)
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

    logs.setup(settings.log_format, settings.log_level)
    readiness = Readiness()
    if settings.worker_metrics_port:  # /metrics, /healthz and /readyz
        metrics.serve(settings.worker_metrics_port, readiness=readiness.report)

    async def _main() -> None:
        pool = Worker(settings, readiness)
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
    llm_profile: Annotated[
        str | None,
        typer.Option(help="A server LLM profile (kind, URL, key) instead of --base-url."),
    ] = None,
    max_steps: Annotated[int, typer.Option(min=1)] = 100,
    temperature: Annotated[float, typer.Option(min=0, max=2)] = 1.0,
    max_tokens_per_call: Annotated[int, typer.Option(min=1)] = 8192,
    tools_profile: Annotated[str, typer.Option(help="standard or reference.")] = "standard",
    shell: Annotated[
        str, typer.Option(help="fresh (a new shell per command) or persistent (standard only).")
    ] = "fresh",
    prompt_config: Annotated[
        str, typer.Option(help="A prompt config name, or a YAML file in the package's format.")
    ] = "general",
    answer_all_tool_calls: Annotated[
        bool | None,
        typer.Option(
            "--answer-all-tool-calls/--first-tool-call-only",
            help="Reply to every tool-call id of a turn (default: on for standard).",
        ),
    ] = None,
    input_dir: Annotated[Path | None, typer.Option(help="Folder copied to the input dir.")] = None,
    output_dir: Annotated[Path, typer.Option(help="Where run folders go.")] = Path("output"),
) -> None:
    """Run one task locally in a sandbox, with no Postgres or Redis."""
    from app.llm.profiles import model_for_profile
    from app.local import LocalRun

    settings = Settings()
    if tools_profile not in ("standard", "reference"):
        raise typer.BadParameter("tools profile must be standard or reference")
    if shell != "fresh" and (shell, tools_profile) != ("persistent", "standard"):
        raise typer.BadParameter("shell must be fresh, or persistent with the standard profile")
    profile = _run_profile(settings, llm_profile, base_url, api_key)
    name = model or profile.model
    if not profile.base_url or not name:
        console.print("[red]no model: pass --base-url and --model (or try `sandhive demo`)[/]")
        raise typer.Exit(2)
    chat = model_for_profile(
        profile,
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
        shell=shell,
        output_root=output_dir,
        inputs=_read_inputs(input_dir),
        prompt_config=_run_prompt(settings, prompt_config),
        answer_all_tool_calls=answer_all_tool_calls,
    )
    _run_local(settings, chat, job)


def _run_profile(
    settings: Settings, name: str | None, base_url: str | None, api_key: str | None
) -> LLMProfile:
    """The provider of `sandhive run`: a named server profile, or the flags over `default`."""
    from pydantic import SecretStr

    from app.config import LLMProfile

    if name is not None:
        found = settings.llm_profiles().get(name)
        if found is None:
            raise typer.BadParameter(f"no LLM profile {name!r} (SANDHIVE_LLM_PROFILES_FILE)")
        return found
    key = api_key if api_key is not None else settings.llm_api_key.get_secret_value()
    return LLMProfile(
        kind=settings.llm_kind,
        base_url=base_url or settings.llm_base_url,
        api_key=SecretStr(key),
        model=settings.llm_model,
    )


def _run_prompt(settings: Settings, choice: str) -> PromptSpec:
    """A built-in or configured name, or a path to a YAML prompt file."""
    from app.errors import InvalidInput
    from app.prompt_configs import load_prompt_file, resolve_prompt

    workdir = settings.sandbox_workdir
    try:
        if choice.endswith((".yaml", ".yml")) or "/" in choice:
            return load_prompt_file(Path(choice), workdir=workdir)
        return resolve_prompt(choice, workdir=workdir, configs_dir=settings.prompt_configs_dir)
    except InvalidInput as exc:
        raise typer.BadParameter(exc.message) from None


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


def _run_local(settings: Settings, chat: HTTPChatModel, job: LocalRun) -> None:
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


# API keys (issue 5): `sandhive keys create|list|revoke`, straight against Postgres.

_T = TypeVar("_T")


def _with_sessions(use: Callable[[async_sessionmaker[AsyncSession]], Awaitable[_T]]) -> _T:
    """Run one service call on a short-lived engine; a bad input exits 2 with its message."""
    from app.db.engine import create_engine, create_sessions
    from app.errors import AppError

    async def _go() -> _T:
        engine = create_engine(Settings().database_url)
        try:
            return await use(create_sessions(engine))
        finally:
            await engine.dispose()

    try:
        return asyncio.run(_go())
    except AppError as exc:
        err_console.print(f"[red]{exc.message}[/]")
        raise typer.Exit(2 if exc.status == 422 else 1) from exc


@keys_cli.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="The tenant the key acts as.")],
    name: Annotated[str, typer.Option(help="A note to recognise the key by.")] = "",
) -> None:
    """Create an API key. It is printed once (alone on stdout) and stored only as a hash."""
    from app.services import keys

    created = _with_sessions(lambda sessions: keys.create_key(sessions, tenant, name))
    err_console.print(f"created {created.id} for tenant {created.tenant}; keep the key now:")
    typer.echo(created.key)


@keys_cli.command("list")
def keys_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
) -> None:
    """Every key's id, tenant, name and dates (never the keys themselves)."""
    from app.services import keys

    for item in _with_sessions(lambda sessions: keys.list_keys(sessions, tenant)):
        revoked = f"revoked {item.revoked_at:%Y-%m-%d %H:%M}" if item.revoked_at else "active"
        typer.echo(
            f"{item.id}\t{item.tenant}\t{item.created_at:%Y-%m-%d %H:%M}\t{revoked}\t{item.name}"
        )


@keys_cli.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="The key's id (key_...).")]) -> None:
    """Revoke a key: requests with it answer 401 from now on."""
    from app.services import keys

    item = _with_sessions(lambda sessions: keys.revoke_key(sessions, key_id))
    typer.echo(f"revoked {item.id} (tenant {item.tenant})")
