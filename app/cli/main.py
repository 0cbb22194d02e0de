"""The `sandhive` command: parse arguments, build Settings, call one entry point each.

serve · worker · migrate · run · demo · mcp (`image` is app/cli/image.py). Nothing else lives here.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.console import Console

from app.cli.admin import admin_cli
from app.cli.common import call, fail
from app.cli.experiment import experiment_cli
from app.cli.image import image_cli
from app.config import Settings

cli = typer.Typer(help="Sandhive: LLM agents in disposable Docker sandboxes.", no_args_is_help=True)
cli.add_typer(image_cli, name="image")  # the image catalogue: app/cli/image.py (docs/images.md)
keys_cli = typer.Typer(help="API keys: create, list, revoke.", no_args_is_help=True)
cli.add_typer(keys_cli, name="keys")
cli.add_typer(admin_cli, name="admin")  # operations: app/cli/admin.py (docs/operations.md)
cli.add_typer(experiment_cli, name="experiment")  # app/cli/experiment.py (docs/experiments.md)
console = Console()
err_console = Console(stderr=True)
ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

if TYPE_CHECKING:
    from app.clients import demo as demo_client
    from app.domain.package_settings import PackageSettings


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
    _warn_without_model(settings, "serve")
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
    _warn_without_model(settings, "worker")
    readiness = Readiness()
    if settings.worker_metrics_port:  # /metrics, /healthz and /readyz
        metrics.serve(settings.worker_metrics_port, readiness=readiness.report)

    async def _main(settings: Settings) -> None:
        pool = Worker(settings, readiness)
        pool.install_signal_handlers()
        await pool.run(burst=burst)

    with serving(settings) as served:  # the `scripted` profile's server, when it is on
        asyncio.run(_main(served))
    # Exiting now: spare the interpreter's last garbage collection a walk over every object,
    # a few hundred ms on a busy host and otherwise most of an idle worker's exit.
    gc.freeze()


@cli.command()
def migrate(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
) -> None:
    """Bring the database schema to a revision (Alembic upgrade)."""
    from alembic import command
    from alembic.config import Config

    from app.cli.common import UNREACHABLE, unreachable_postgres

    config = Config(str(_find("alembic.ini")))
    config.set_main_option("script_location", str(_find("migrations")))
    config.set_main_option("sqlalchemy.url", Settings().database_url.replace("%", "%%"))
    try:
        command.upgrade(config, revision)
    except UNREACHABLE as exc:
        fail(unreachable_postgres(exc))
    console.print(f"database at {revision}")


MODEL, LIMITS, AGENT, FILES = "Model", "Limits", "Agent", "Files"
"""`sandhive run --help`'s panels, so that the help reads at 80 columns."""


@cli.command()
def run(
    prompt: Annotated[str | None, typer.Option(help="The task for the agent.")] = None,
    scripted: Annotated[
        bool,
        typer.Option(
            "--scripted", help="The built-in scripted model, offline.", rich_help_panel=MODEL
        ),
    ] = False,
    model: Annotated[
        str | None,
        typer.Option(help="Model name (scripted: demo or tour).", rich_help_panel=MODEL),
    ] = None,
    base_url: Annotated[
        str | None, typer.Option(help="OpenAI-compatible base URL.", rich_help_panel=MODEL)
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(help="API key (or SANDHIVE_LLM_API_KEY).", rich_help_panel=MODEL),
    ] = None,
    llm_profile: Annotated[
        str | None,
        typer.Option(help="A configured LLM profile instead.", rich_help_panel=MODEL),
    ] = None,
    temperature: Annotated[float | None, typer.Option(rich_help_panel=MODEL)] = None,
    max_tokens_per_call: Annotated[int | None, typer.Option(rich_help_panel=MODEL)] = None,
    extra_body: Annotated[
        str | None, typer.Option(help="JSON merged into requests.", rich_help_panel=MODEL)
    ] = None,
    max_steps: Annotated[int | None, typer.Option(rich_help_panel=LIMITS)] = None,
    timeout_s: Annotated[
        int | None, typer.Option(help="The task's wall clock.", rich_help_panel=LIMITS)
    ] = None,
    command_timeout_s: Annotated[
        int | None, typer.Option(help="Per command.", rich_help_panel=LIMITS)
    ] = None,
    max_context_tokens: Annotated[int | None, typer.Option(rich_help_panel=LIMITS)] = None,
    mode: Annotated[
        str, typer.Option(help="sandbox, or vanilla (no tools).", rich_help_panel=AGENT)
    ] = "sandbox",
    tools_profile: Annotated[
        str, typer.Option(help="standard or reference.", rich_help_panel=AGENT)
    ] = "standard",
    shell: Annotated[
        str, typer.Option(help="fresh or persistent (standard only).", rich_help_panel=AGENT)
    ] = "fresh",
    prompt_config: Annotated[
        str | None,
        typer.Option(
            help="A prompt config or YAML file (default: general).", rich_help_panel=AGENT
        ),
    ] = None,
    answer_all_tool_calls: Annotated[
        bool,
        typer.Option(
            "--answer-all-tool-calls",
            help="Answer every tool-call id (standard's default).",
            rich_help_panel=AGENT,
        ),
    ] = False,
    first_tool_call_only: Annotated[
        bool,
        typer.Option(
            "--first-tool-call-only",
            help="Answer only the first (reference's default).",
            rich_help_panel=AGENT,
        ),
    ] = False,
    image: Annotated[
        str | None, typer.Option(help="The sandbox's Docker image.", rich_help_panel=AGENT)
    ] = None,
    input_dir: Annotated[
        Path | None, typer.Option(help="Copied to the input dir.", rich_help_panel=FILES)
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option(help="Where run folders go (default: output).", rich_help_panel=FILES),
    ] = None,
    save_exchanges: Annotated[
        bool,
        typer.Option(
            "--save-exchanges", help="Also each model request/response.", rich_help_panel=FILES
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print the resolved task and exit.", rich_help_panel=FILES),
    ] = False,
    # The llm-in-sandbox package's names (docs/coming-from-llm-in-sandbox.md), kept out
    # of --help: the same options as above, plus its settings file.
    query: Annotated[str | None, typer.Option("--query", hidden=True)] = None,
    llm_name: Annotated[str | None, typer.Option("--llm_name", hidden=True)] = None,
    llm_base_url: Annotated[str | None, typer.Option("--llm_base_url", hidden=True)] = None,
    package_api_key: Annotated[str | None, typer.Option("--api_key", hidden=True)] = None,
    docker_image: Annotated[str | None, typer.Option("--docker_image", hidden=True)] = None,
    max_token_limit: Annotated[int | None, typer.Option("--max_token_limit", hidden=True)] = None,
    package_extra_body: Annotated[str | None, typer.Option("--extra_body", hidden=True)] = None,
    package_input_dir: Annotated[Path | None, typer.Option("--input_dir", hidden=True)] = None,
    package_output_dir: Annotated[Path | None, typer.Option("--output_dir", hidden=True)] = None,
    package_prompt_config: Annotated[
        str | None, typer.Option("--prompt_config", hidden=True)
    ] = None,
    package_max_steps: Annotated[int | None, typer.Option("--max_steps", hidden=True)] = None,
    package_max_tokens_per_call: Annotated[
        int | None, typer.Option("--max_tokens_per_call", hidden=True)
    ] = None,
    save_litellm_response: Annotated[
        bool, typer.Option("--save_litellm_response", hidden=True)
    ] = False,
    settings_file: Annotated[Path | None, typer.Option("--settings", hidden=True)] = None,
) -> None:
    """Run one task locally, in a sandbox of its own, with no Postgres or Redis.

    Unset options take the server's defaults (SANDHIVE_DEFAULT_*); its maxima apply.

    No model at hand? --scripted --model tour plays a fixed script, offline.
    """
    from app.domain.package_settings import PackageOptionError, load_package_settings, model_name

    try:
        if llm_name is not None:
            llm_name = model_name(llm_name)
        body_text = _alias("--extra-body", extra_body, "--extra_body", package_extra_body)
        body = _extra_body(body_text)
        package = load_package_settings(settings_file)
    except PackageOptionError as exc:
        raise typer.BadParameter(str(exc)) from None
    prompt = _alias("--prompt", prompt, "--query", query)
    if prompt is None:
        raise typer.BadParameter("missing option --prompt (or the package's --query)")
    model = _alias("--model", model, "--llm_name", llm_name)
    base_url = _alias("--base-url", base_url, "--llm_base_url", llm_base_url)
    api_key = _alias("--api-key", api_key, "--api_key", package_api_key)
    image = _alias("--image", image, "--docker_image", docker_image)
    max_context_tokens = _alias(
        "--max-context-tokens", max_context_tokens, "--max_token_limit", max_token_limit
    )
    max_steps = _alias("--max-steps", max_steps, "--max_steps", package_max_steps)
    max_tokens_per_call = _alias(
        "--max-tokens-per-call",
        max_tokens_per_call,
        "--max_tokens_per_call",
        package_max_tokens_per_call,
    )
    input_dir = _alias("--input-dir", input_dir, "--input_dir", package_input_dir)
    output_dir = _alias("--output-dir", output_dir, "--output_dir", package_output_dir)
    prompt_config = _alias(
        "--prompt-config", prompt_config, "--prompt_config", package_prompt_config
    )
    save_exchanges = save_exchanges or save_litellm_response
    llm_profile = _scripted_profile(scripted, llm_profile)
    if package.path is not None:  # the package's file: beneath the command line
        err_console.print(f"settings: {package.path}", markup=False, highlight=False)
        prompt_config = prompt_config or package.values.get("prompt_config")
        if llm_profile is None:
            model, base_url, api_key = _file_model(package, model, base_url, api_key)
    prompt_config = prompt_config or "general"
    settings = _with_model_flags(Settings(), llm_profile, base_url, api_key)
    if image:
        settings = settings.model_copy(update={"sandbox_image": image})
    if answer_all_tool_calls and first_tool_call_only:
        raise typer.BadParameter("--answer-all-tool-calls or --first-tool-call-only, not both")
    answer_all = True if answer_all_tool_calls else False if first_tool_call_only else None
    options: dict[str, object] = {
        "mode": mode,
        "prompt": prompt,
        "llm": _given(
            profile=llm_profile or "default",
            model=model,
            temperature=temperature,
            max_tokens_per_call=max_tokens_per_call,
            extra_body=body,
        ),
        "limits": _given(
            max_steps=max_steps,
            timeout_s=timeout_s,
            command_timeout_s=command_timeout_s,
            max_context_tokens=max_context_tokens,
        ),
        "tools": _given(profile=tools_profile, shell=shell, answer_all_tool_calls=answer_all),
        "prompt_config": _run_prompt(settings, prompt_config),
    }
    if mode == "vanilla":  # no tools; the sandbox's default prompt is not a vanilla one
        options = _vanilla_options(options, prompt_config)
    inputs = _read_inputs(input_dir)
    output_root = output_dir or Path("output")
    if dry_run:
        _print_resolved(settings, options, inputs, output_root, save_exchanges)
        return
    from app.scripted.profile import serving

    with serving(settings) as served:  # `--llm-profile scripted`: its server, in-process
        _run_local(served, options, inputs, output_root, save_exchanges)


def _file_model(
    package: PackageSettings, model: str | None, base_url: str | None, api_key: str | None
) -> tuple[str | None, str | None, str | None]:
    """The settings file's model, URL and key where the command line gave none."""
    from app.domain.package_settings import PackageOptionError, model_name

    file_model = package.values.get("llm_name")
    try:
        model = model or (model_name(file_model) if file_model else None)
    except PackageOptionError as exc:
        raise typer.BadParameter(f"{package.path}: {exc}") from None
    base_url = base_url or package.values.get("llm_base_url")
    return model, base_url, api_key if api_key is not None else package.values.get("api_key")


def _alias(ours: str, value: T | None, theirs: str, package_value: T | None) -> T | None:
    """One option under two names: Sandhive's and the package's (never both, differing)."""
    if value is not None and package_value is not None and value != package_value:
        raise typer.BadParameter(f"{ours} and {theirs} are one option: give it once")
    return value if value is not None else package_value


def _extra_body(text: str | None) -> dict[str, object] | None:
    if text is None:
        return None
    from app.domain.package_settings import parse_extra_body

    return parse_extra_body(text)


def _print_resolved(
    settings: Settings,
    options: dict[str, object],
    inputs: list[tuple[str, bytes]],
    output_root: Path,
    save_exchanges: bool,
) -> None:
    """`--dry-run`: what the run would do, as JSON (the key only as a fingerprint)."""
    import hashlib
    import json

    from app.errors import InvalidInput
    from app.runner.local import resolve_run

    try:
        spec = resolve_run(settings, options)
    except InvalidInput as exc:
        fail(exc.message, code=2)
    profile = settings.llm_profiles().get(spec.llm.profile)
    key = profile.api_key.get_secret_value() if profile is not None else ""
    resolved = {
        "prompt": options["prompt"],
        "spec": spec.model_dump(mode="json"),
        "base_url": profile.base_url if profile is not None else None,
        "api_key_sha256": hashlib.sha256(key.encode()).hexdigest()[:12] if key else None,
        "inputs": [name for name, _ in inputs],
        "output_dir": str(output_root),
        "save_exchanges": save_exchanges,
    }
    typer.echo(json.dumps(resolved, indent=2, sort_keys=True))


def _scripted_profile(scripted: bool, profile: str | None) -> str | None:
    """`--scripted` is short for `--llm-profile scripted`."""
    from app.config import SCRIPTED_PROFILE

    if scripted and profile not in (None, SCRIPTED_PROFILE):
        raise typer.BadParameter("--scripted is a profile of its own: leave out --llm-profile")
    return SCRIPTED_PROFILE if scripted else profile


def _vanilla_options(options: dict[str, object], prompt_config: str) -> dict[str, object]:
    """Leave out the tools and prompt options `run` always sends, unless given otherwise
    (then resolution refuses them as it refuses a vanilla submission that has them)."""
    vanilla = dict(options)
    if vanilla["tools"] == {"profile": "standard", "shell": "fresh"}:
        del vanilla["tools"]
    if prompt_config == "general":
        del vanilla["prompt_config"]
    return vanilla


def _warn_without_model(settings: Settings, command: str) -> None:
    """Say at start-up what to set when no real model is configured."""
    import logging

    notice = settings.no_model_notice()
    if notice is not None:
        logging.getLogger("app.cli.main").warning("sandhive %s: %s", command, notice)


def _given(**options: object) -> dict[str, object]:
    return {key: value for key, value in options.items() if value is not None}


def _with_model_flags(
    settings: Settings, profile: str | None, base_url: str | None, api_key: str | None
) -> Settings:
    """`--base-url` and `--api-key` stand in for the `default` profile's URL and key."""
    from pydantic import SecretStr

    from app.config import SCRIPTED_PROFILE

    if profile is not None and (base_url or api_key):
        raise typer.BadParameter("--llm-profile names a profile: leave out --base-url/--api-key")
    update: dict[str, object] = {"scripted_profile": True} if profile == SCRIPTED_PROFILE else {}
    if base_url:
        update["llm_base_url"] = base_url
    if api_key is not None:
        update["llm_api_key"] = SecretStr(api_key)
    if profile is None and not (base_url or settings.llm_base_url):
        fail("no model: pass --base-url and --model (or --llm-profile scripted)", code=2)
    return settings.model_copy(update=update)


def _run_prompt(settings: Settings, choice: str) -> str | dict[str, str]:
    """A prompt config name, or a YAML file in the package's format as a custom pair."""
    if not (choice.endswith((".yaml", ".yml")) or "/" in choice):
        return choice
    from app.domain.prompt_configs import load_prompt_file
    from app.errors import InvalidInput

    try:
        loaded = load_prompt_file(Path(choice), workdir=settings.sandbox_workdir)
    except InvalidInput as exc:
        fail(exc.message, code=2)
    return loaded.model_dump(
        include={"system", "instance", "working_dir", "input_dir", "output_dir"}
    )


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
        _run_local(settings, {"prompt": DEMO_PROMPT}, [], output_dir)


def _demo_through(service: demo_client.Service, prompt: str) -> None:
    from app.clients import demo as demo_client

    task_id = demo_client.submit(service, prompt, "demo")
    console.print(f"submitted {task_id}: watch it at {service.url}/#/tasks/{task_id}")
    task = demo_client.wait(service, task_id)
    console.print(f"status: [bold]{task['status']}[/] ({task.get('finish_reason')})")
    if task.get("answer") is not None:
        console.print(f"answer: {task['answer']}")


@cli.command()
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


def _run_local(
    settings: Settings,
    options: dict[str, object],
    inputs: list[tuple[str, bytes]],
    output_dir: Path,
    save_exchanges: bool = False,
) -> None:
    from app.errors import InvalidInput
    from app.runner.local import resolve_run, run_local

    try:
        spec = resolve_run(settings, options)
    except InvalidInput as exc:
        fail(exc.message, code=2)
    prompt = str(options["prompt"])

    async def _go() -> None:
        await run_local(
            settings,
            spec,
            prompt,
            console,
            output_root=output_dir,
            inputs=inputs,
            save_exchanges=save_exchanges,
        )

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


# API keys: `sandhive keys create|list|revoke`, straight against Postgres (docs/security.md).


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
