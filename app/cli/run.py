"""`sandhive run`: one task in a sandbox on this machine, no service (docs/run.md).

Options are resolved as the API resolves a submission (`app.runner.local.resolve_run`),
with the reference package's names and settings file accepted beside ours.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.console import Console

from app.cli.common import fail
from app.config import Settings

if TYPE_CHECKING:
    from app.domain.package_settings import PackageSettings

console = Console()
err_console = Console(stderr=True)
T = TypeVar("T")


MODEL, LIMITS, AGENT, FILES = "Model", "Limits", "Agent", "Files"
"""`sandhive run --help`'s panels, so that the help reads at 80 columns."""


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
        run_local(served, options, inputs, output_root, save_exchanges)


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


def run_local(
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
