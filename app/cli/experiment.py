"""`sandhive experiment`: run a package-format task folder and read experiments back.

`run` reads the folder (`app.domain.package_folder`) and submits it to a service, shows a progress
bar per arm until it finishes and prints the results table; `--local` runs it in this
process instead (`app.runner.experiment_local`). `status`, `results`, `items`, `cancel`,
`regrade` and `export` are thin calls of the API. Exit codes as every command: 2 for input
refused as invalid (a bad folder, a 422), 1 for other refusals and an unreachable service.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import signal
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table

from app.cli.common import fail
from app.domain import harbor_folder
from app.domain.package_folder import (
    FolderError,
    RunOptions,
    experiment_body,
    parse_arms,
    parse_mode,
    parse_rules,
    parse_scorer,
    read_source,
    summary,
)

experiment_cli = typer.Typer(
    help="Experiments: run a benchmark task folder, follow it, read its results.",
    no_args_is_help=True,
)
err_console = Console(stderr=True)
POLL_S = 1.0
DONE = ("scored", "error", "cancelled")
ServerOpt = Annotated[
    str, typer.Option("--server", envvar="SANDHIVE_SERVER", help="The service's URL.")
]
KeyOpt = Annotated[
    str | None, typer.Option("--api-key", envvar="SANDHIVE_API_KEY", help="Its API key.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON only (for scripts).")]
DEFAULT_SERVER = "http://127.0.0.1:8000"


class Api:
    """The service's experiments API; any failure ends the command with its message."""

    def __init__(self, server: str, api_key: str | None) -> None:
        self.server = server.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.server, headers=headers, timeout=60.0)

    def call(self, method: str, path: str, **options: Any) -> httpx.Response:
        try:
            response = self.client.request(method, path, **options)
        except httpx.HTTPError as exc:
            fail(f"cannot reach the service at {self.server} ({exc}): is it running (--server)?")
        if response.status_code >= 400:
            _refused(response)
        return response

    def json(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        data: dict[str, Any] = self.call(method, path, **options).json()
        return data


def _refused(response: httpx.Response) -> NoReturn:
    try:
        error = response.json()["error"]
        message = str(error["message"])
    except (ValueError, KeyError, TypeError):
        message = response.text[:500] or response.reason_phrase
    fail(f"{response.status_code}: {message}", code=2 if response.status_code == 422 else 1)


@experiment_cli.command("run")
def run(
    path: Annotated[
        Path | None,
        typer.Argument(help="A task folder in the package's format (or none, with --data)."),
    ] = None,
    mode: Annotated[str, typer.Option(help="sandbox, vanilla or both (two arms).")] = "sandbox",
    arms: Annotated[
        str | None, typer.Option(help="The arms by name: sandbox, vanilla or sandbox,vanilla.")
    ] = None,
    rules: Annotated[
        str, typer.Option(help="How ends are scored: package (as llm-in-sandbox) or sandhive.")
    ] = "package",
    server: ServerOpt = DEFAULT_SERVER,
    api_key: KeyOpt = None,
    local: Annotated[
        bool,
        typer.Option(
            "--local", help="Run here, in this process (no service, no Postgres or Redis)."
        ),
    ] = False,
    json_out: JsonOpt = False,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="Submit, print the id and return.")
    ] = False,
    data: Annotated[
        Path | None, typer.Option(help="Rows from this JSON/JSONL file instead of config.yaml's.")
    ] = None,
    start_id: Annotated[int | None, typer.Option(help="First row (0-based).")] = None,
    end_id: Annotated[int | None, typer.Option(help="Past the last row (0-based).")] = None,
    attempts: Annotated[int, typer.Option(help="Attempts per row and arm (pass@k).")] = 1,
    concurrency: Annotated[int, typer.Option(help="Items running at once.")] = 8,
    max_steps: Annotated[int | None, typer.Option(help="The sandbox arm's.")] = None,
    llm_profile: Annotated[str | None, typer.Option(help="An LLM profile of the server.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name.")] = None,
    vanilla_model: Annotated[
        str | None, typer.Option(help="Another model for the vanilla arm (default --model).")
    ] = None,
    temperature: Annotated[float | None, typer.Option()] = None,
    scorer: Annotated[
        str | None,
        typer.Option(help='Instead of reward.py: a built-in scorer ("math") or its JSON.'),
    ] = None,
    name: Annotated[str | None, typer.Option(help="The experiment's name.")] = None,
    base_url: Annotated[
        str | None, typer.Option(help="--local: an OpenAI-compatible base URL for the model.")
    ] = None,
    output_dir: Annotated[Path, typer.Option(help="--local: where run folders go.")] = Path(
        "output"
    ),
    writable_rootfs: Annotated[
        bool,
        typer.Option(
            "--writable-rootfs",
            help="Harbor tasks: let the agent write the image's files (/app, say); the server"
            " must allow it (SANDHIVE_SANDBOX_ALLOW_WRITABLE_ROOTFS).",
        ),
    ] = False,
    egress: Annotated[
        bool,
        typer.Option(
            "--egress",
            help="Harbor tasks: outbound network for the agent and the verifier (many"
            " tests/test.sh install their tools); the server must enable egress.",
        ),
    ] = False,
) -> None:
    """Run a benchmark task folder (config.yaml, reward.py, ...), a Harbor task folder or a
    folder of them (task.toml, instruction.md, environment/, tests/), or the rows of a
    --data file with a --scorer, as an experiment."""
    try:
        chosen = parse_arms(arms) if arms is not None else parse_mode(mode)
        options = RunOptions(
            mode=chosen,
            start_id=start_id,
            end_id=end_id,
            attempts=attempts,
            concurrency=concurrency,
            max_steps=max_steps,
            llm_profile=llm_profile,
            model=model,
            vanilla_model=vanilla_model,
            temperature=temperature,
            scorer=parse_scorer(scorer) if scorer is not None else None,
            name=name,
            writable_rootfs=writable_rootfs,
            egress=egress,
        )
        if path is not None and harbor_folder.is_harbor(path):
            if local:
                fail(
                    "Harbor tasks run on a service, which builds their images: drop --local", code=2
                )
            tasks = harbor_folder.read_harbor(path)[start_id:end_id]
            if not tasks:
                raise FolderError(f"{path}: no task between --start-id and --end-id")
            body = harbor_folder.harbor_body(tasks, options)
            _run_harbor(tasks, body, Api(server, api_key), json_out=json_out, no_wait=no_wait)
            return
        folder = read_source(path, data, vanilla=chosen != "sandbox")
        body = {**experiment_body(folder, options), "rules": parse_rules(rules)}
    except FolderError as exc:
        fail(str(exc), code=2)
    if not json_out:
        for line in summary(folder):
            err_console.print(line, markup=False, highlight=False)
    if local:
        _run_local(body, folder.name, llm_profile, base_url, output_dir, json_out)
        return
    _submit_and_follow(Api(server, api_key), body, json_out=json_out, no_wait=no_wait)


def _submit_and_follow(api: Api, body: dict[str, Any], *, json_out: bool, no_wait: bool) -> None:
    """Create the experiment and follow it to its end with bars (or return its id at once);
    the results table, or JSON; exit 1 unless it finished."""
    experiment = api.json("POST", "/v1/experiments", json=body)
    exp_id = experiment["id"]
    if no_wait:
        _print_json(experiment) if json_out else typer.echo(exp_id)
        return
    if not json_out:
        err_console.print(f"experiment {exp_id} on {api.server}")
    followed = _follow(api, experiment, quiet=json_out)
    if followed is None:  # Ctrl-C
        err_console.print(
            f"\nstopped following; experiment {exp_id} keeps running "
            f"(sandhive experiment status {exp_id}; cancel with sandhive experiment cancel)"
        )
        raise typer.Exit(130)
    experiment = followed
    results = api.json("GET", f"/v1/experiments/{exp_id}/results")
    if json_out:
        _print_json({"experiment": experiment, "results": results})
    else:
        print_results(results)
    if experiment["status"] != "finished":
        raise typer.Exit(1)


def _run_harbor(
    tasks: list[harbor_folder.HarborTask],
    body: dict[str, Any],
    api: Api,
    *,
    json_out: bool,
    no_wait: bool,
) -> None:
    """Build each task's environment on the server (once per content: a ready image of the
    same name is used as it is), then run the experiment as any other."""
    for task in tasks:
        _ensure_image(api, task, quiet=json_out)
    _submit_and_follow(api, body, json_out=json_out, no_wait=no_wait)


def _ensure_image(api: Api, task: harbor_folder.HarborTask, *, quiet: bool) -> None:
    """The task's environment built as `built/harbor-<hash>` unless it is already (or is
    being built by another caller: then waited for)."""
    name = task.image_name
    state = _build_status(api, name)
    if state == "ready":
        return
    if state != "building":
        if not quiet:
            err_console.print(f"building {task.name}'s environment as built/{name}")
        body = {
            "name": name,
            "dockerfile": task.dockerfile,
            "context": base64.b64encode(task.context).decode("ascii"),
            "description": f"Harbor task {task.name}"[:1000],
        }
        response = _request(api, "POST", "/v1/images/builds", json=body, timeout=_wait_s(task))
        if response.status_code < 400:
            return
        details = _error_details(response)
        if response.status_code != 409 or details.get("status") != "building":
            _refused(response)
    deadline = time.monotonic() + _wait_s(task)
    while (state := _build_status(api, name)) == "building" and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if state != "ready":
        fail(f"{task.path}: its environment did not build as built/{name} ({state})", code=2)


SERVER_BUILD_TIMEOUT_S = 900.0
"""The server's default `SANDHIVE_IMAGE_BUILD_TIMEOUT_S`: a build's answer may take it."""


def _wait_s(task: harbor_folder.HarborTask) -> float:
    return max(task.build_timeout_s, SERVER_BUILD_TIMEOUT_S) + 60


def _build_status(api: Api, name: str) -> str | None:
    """`ready`, `building` or `failed`; None when the tenant has no such image."""
    response = _request(api, "GET", f"/v1/images/builds/{name}")
    if response.status_code == 404:
        return None
    if response.status_code >= 400:
        _refused(response)
    return str(response.json().get("status"))


def _request(api: Api, method: str, path: str, **options: Any) -> httpx.Response:
    try:
        return api.client.request(method, path, **options)
    except httpx.HTTPError as exc:
        fail(f"cannot reach the service at {api.server} ({exc}): is it running (--server)?")


def _error_details(response: httpx.Response) -> dict[str, Any]:
    try:
        details = response.json()["error"]["details"]
    except (ValueError, KeyError, TypeError):
        return {}
    return details if isinstance(details, dict) else {}


def _follow(api: Api, experiment: dict[str, Any], *, quiet: bool) -> dict[str, Any] | None:
    """Poll the experiment until it is no longer running, a bar per arm unless `quiet`; None
    once Ctrl-C asked to stop following.

    Ctrl-C sets a flag that the loop reads between polls instead of raising
    KeyboardInterrupt wherever the main thread happens to be: raised inside the progress
    bars' or a thread's locking, it could leave the command hanging after one Ctrl-C.
    """
    path = f"/v1/experiments/{experiment['id']}"
    per_arm = int(experiment["rows"]) * int(experiment["attempts"])
    with (
        interrupt_flag() as interrupted,
        ProgressView(experiment["progress"], per_arm, enabled=not quiet) as view,
    ):
        while True:
            view.update(experiment["progress"])
            if experiment["status"] != "running":
                return experiment
            if interrupted.wait(POLL_S):
                return None
            experiment = api.json("GET", path)
            if interrupted:
                return None


class Interrupted:
    """Set by SIGINT's handler, read by the loop: a plain flag, because a handler that took a
    lock (`threading.Event.set`) could wait for a lock its own thread holds."""

    def __init__(self) -> None:
        self.set = False

    def __bool__(self) -> bool:
        return self.set

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`, in short slices; whether SIGINT came meanwhile."""
        end = time.monotonic() + seconds
        while not self.set and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.05))
        return self.set


@contextmanager
def interrupt_flag() -> Iterator[Interrupted]:
    """A flag that SIGINT sets (instead of raising KeyboardInterrupt) while inside; a second
    Ctrl-C raises it at once (a request the service does not answer). A SIGINT the caller
    ignores (a background job) stays ignored."""
    interrupted = Interrupted()

    def on_sigint(*_: object) -> None:
        if interrupted.set:
            raise KeyboardInterrupt
        interrupted.set = True

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield interrupted
        return
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


class ProgressView:
    """One bar per arm: done items of all, and how many scored, failed, are running."""

    def __init__(self, arms: Iterable[str], total: int, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.bars = Progress(
            TextColumn("{task.fields[arm]:>10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"),
            console=err_console,
            disable=not enabled,
        )
        self.ids: dict[str, TaskID] = {
            arm: self.bars.add_task("", total=total, arm=arm, counts="") for arm in arms
        }

    def __enter__(self) -> ProgressView:
        self.bars.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bars.__exit__(None, None, None)

    def update(self, progress: Mapping[str, Mapping[str, int]]) -> None:
        for arm, counts in progress.items():
            done = sum(int(counts.get(key, 0)) for key in DONE)
            shown = ", ".join(
                f"{key} {counts[key]}"
                for key in ("running", "scoring", "scored", "error", "cancelled")
                if counts.get(key)
            )
            if arm in self.ids:
                self.bars.update(self.ids[arm], completed=done, counts=shown)


def print_results(results: Mapping[str, Any]) -> None:
    """The results as two tables: per arm, and the paired comparisons."""
    arms = results["arms"]
    ks = sorted({k for arm in arms for k in (arm.get("pass_at_k") or {})}, key=int)
    console = Console()  # the terminal's width now (COLUMNS), not when the module was imported
    table = Table(title=f"results ({results.get('status', '')})")
    columns = ("arm", "n", "coverage", "mean", "ci95", *(f"pass@{k}" for k in ks), "errors")
    for column in columns:
        table.add_column(column, justify="left" if column in ("arm", "errors") else "right")
    table.add_column("tokens (prompt/completion)", justify="right")
    for arm in arms:
        pass_at_k = arm.get("pass_at_k") or {}
        table.add_row(
            arm["arm"],
            str(arm["n"]),
            coverage_text(arm.get("coverage")),
            _num(arm["mean"]),
            _interval(arm["ci95"]),
            *(_num(pass_at_k.get(k)) for k in ks),
            _errors(arm),
            f"{arm['prompt_tokens']['total']:.0f}/{arm['completion_tokens']['total']:.0f}",
        )
    console.print(table)
    if results.get("pairs"):
        pairs = Table(title="paired comparison (a - b, on the rows both scored)")
        columns = ("a", "b", "n", "mean a", "mean b", "difference", "ci95", "W/T/L", "p")
        for column in (*columns, "verdict"):
            left = column in ("a", "b", "verdict")
            pairs.add_column(column, justify="left" if left else "right")
        for pair in results["pairs"]:
            pairs.add_row(
                pair["a"],
                pair["b"],
                str(pair["n"]),
                _num(pair["mean_a"]),
                _num(pair["mean_b"]),
                _num(pair["difference"], signed=True),
                f"{_interval(pair['ci95'], signed=True)} {pair.get('ci95_method', '')}".strip(),
                f"{pair['wins']}/{pair['ties']}/{pair['losses']}",
                _p_value(pair.get("p_value")),
                str(pair.get("verdict", "")).replace("_", " "),
            )
        console.print(pairs)
        for pair in results["pairs"]:
            if pair.get("summary"):
                console.print(f"{pair['a']} - {pair['b']}: {pair['summary']}", markup=False)


def _p_value(value: float | None) -> str:
    if value is None:
        return "-"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def _num(value: float | None, *, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def _interval(ci: Mapping[str, float] | None, *, signed: bool = False) -> str:
    if ci is None:
        return "-"
    return f"[{_num(ci['low'], signed=signed)}, {_num(ci['high'], signed=signed)}]"


def coverage_text(coverage: Mapping[str, Any] | None) -> str:
    """What the mean stands on, next to it: `8/10 scored, 2 not scored`."""
    if not coverage:
        return "-"
    text = f"{coverage['scored']}/{coverage['items']} scored"
    if coverage.get("not_scored"):
        text += f", {coverage['not_scored']} not scored"
    return text


def _errors(arm: Mapping[str, Any]) -> str:
    parts = [f"{kind} {count}" for kind, count in arm["errors"].items()]
    if arm.get("cancelled"):
        parts.append(f"cancelled {arm['cancelled']}")
    return ", ".join(parts) or "0"


def _print_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False))


# --local


def _run_local(
    body: dict[str, Any],
    task: str,
    llm_profile: str | None,
    base_url: str | None,
    output_dir: Path,
    json_out: bool,
) -> None:
    from app.config import SCRIPTED_PROFILE, Settings
    from app.errors import InvalidInput, TooLarge
    from app.runner import experiment_local
    from app.schemas.experiments import ExperimentCreate
    from app.scripted.profile import serving
    from app.services.experiments.input import check_experiment

    settings = Settings()
    if llm_profile == SCRIPTED_PROFILE:
        settings = settings.model_copy(update={"scripted_profile": True})
    if base_url:
        settings = settings.model_copy(update={"llm_base_url": base_url})
    if llm_profile is None and not settings.llm_base_url:
        fail("no model: pass --base-url and --model, or --llm-profile", code=2)
    with serving(settings) as served:
        try:
            # The service's own checks (pure), so a folder is refused here as it would be there.
            checked = check_experiment(ExperimentCreate.model_validate(body), served)
            body = {**body, "dataset": {"rows": checked.rows}}
            planned, scorer = experiment_local.plan(served, body)
        except (InvalidInput, TooLarge) as exc:
            fail(exc.message, code=2)
        except ValueError as exc:  # pydantic's ValidationError
            fail(str(exc), code=2)
        per_arm = len(planned.body.dataset.rows) * planned.body.attempts
        arms = [arm.name for arm in planned.body.arms]
        with ProgressView(arms, per_arm, enabled=not json_out) as view:

            def update(run: experiment_local.LocalRun) -> None:
                view.update({arm: n.model_dump() for arm, n in run.progress().items()})

            done = asyncio.run(experiment_local.run(served, planned, scorer, on_change=update))
        folder = experiment_local.write_run(output_dir, task, done, served)
    results = done.results().model_dump(mode="json")
    if json_out:
        _print_json({"results": results, "output": str(folder)})
        return
    print_results(results)
    Console().print(f"outputs: {folder}", markup=False, highlight=False, soft_wrap=True)


# Reading experiments back


Show = Callable[[dict[str, Any]], None]
"""How a command prints what the API answered, unless --json."""


def _answer(found: dict[str, Any], json_out: bool, show: Show) -> None:
    if json_out:
        _print_json(found)
    else:
        show(found)


def _experiment_command(name: str, method: str, tail: str, show: Show, doc: str) -> None:
    """Register `sandhive experiment <name> ID`: one call of `method` on the experiment's
    path + `tail`, shown by `show` (or as JSON); the commands with options of their own
    (`items`, `regrade`) are written out."""

    def command(
        experiment_id: str,
        server: ServerOpt = DEFAULT_SERVER,
        api_key: KeyOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        found = Api(server, api_key).json(method, f"/v1/experiments/{experiment_id}{tail}")
        _answer(found, json_out, show)

    experiment_cli.command(name, help=doc)(command)


def _print_status(experiment: dict[str, Any]) -> None:
    console = Console()
    console.print(f"{experiment['id']} [bold]{experiment['status']}[/] {experiment['name']}")
    table = Table()
    keys = ("pending", "running", "scoring", "scored", "agent error", "not scored", "cancelled")
    for column in ("arm", *keys):
        table.add_column(column, justify="left" if column == "arm" else "right")
    for arm, counts in experiment["progress"].items():
        apart = counts.get("not_scored", 0)  # the service's or the scorer's failures: no score
        shown = {**counts, "agent error": counts.get("error", 0) - apart, "not scored": apart}
        table.add_row(arm, *(str(shown.get(key, 0)) for key in keys))
    console.print(table)


_experiment_command(
    "status", "GET", "", _print_status, "The experiment's status and, per arm, its items by status."
)
_experiment_command(
    "results",
    "GET",
    "/results",
    print_results,
    "Per arm n, mean, 95 % interval, pass@k, errors; and the paired comparisons.",
)


@experiment_cli.command("items")
def items(
    experiment_id: str,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: KeyOpt = None,
    json_out: JsonOpt = False,
    csv: Annotated[bool, typer.Option("--csv", help="CSV, as the API gives it.")] = False,
) -> None:
    """Every item: row, arm, attempt, status, score, answer, task."""
    api, path = Api(server, api_key), f"/v1/experiments/{experiment_id}/items"
    if csv:
        typer.echo(api.call("GET", path, params={"format": "csv"}).text, nl=False)
        return
    _answer(api.json("GET", path), json_out, _print_items)


def _print_items(found: dict[str, Any]) -> None:
    table = Table()
    for column in ("row", "arm", "attempt", "status", "score", "answer", "task"):
        table.add_column(column)
    for item in found["items"]:
        status = item["status"] + (f" ({item['error_kind']})" if item.get("error_kind") else "")
        answer = (item.get("answer") or "").strip().replace("\n", " ")
        table.add_row(
            item["row_id"],
            item["arm"],
            str(item["attempt"]),
            status,
            _num(item.get("score")),
            answer[:40] + ("…" if len(answer) > 40 else ""),
            item.get("task_id") or "",
        )
    Console().print(table)


_experiment_command(
    "cancel",
    "POST",
    "/cancel",
    lambda found: typer.echo(f"cancelling {found['id']}"),
    "Cancel it: pending items end cancelled, running ones are stopped.",
)


@experiment_cli.command("regrade")
def regrade(
    experiment_id: str,
    scorer: Annotated[str, typer.Option(help='A built-in scorer ("math") or its JSON.')],
    server: ServerOpt = DEFAULT_SERVER,
    api_key: KeyOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Score the stored answers again with another scorer (no task runs again)."""
    try:
        spec = parse_scorer(scorer)
    except FolderError as exc:
        fail(str(exc), code=2)
    found = Api(server, api_key).json(
        "POST", f"/v1/experiments/{experiment_id}/regrade", json={"scorer": spec}
    )
    _answer(found, json_out, _print_regrading)


def _print_regrading(found: dict[str, Any]) -> None:
    typer.echo(f"regrading {found['id']} (grading {found.get('grading', '?')})")


ExportFormat = Literal["jsonl", "atif", "inspect"]


@experiment_cli.command("export")
def export(
    experiment_id: str,
    format: Annotated[
        ExportFormat,
        typer.Option(
            "--format",
            help="jsonl: one rollout per line; atif: a folder of ATIF trajectories; "
            "inspect: an Inspect eval log per arm.",
        ),
    ] = "jsonl",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="jsonl: the file (default: standard output); atif, inspect: the folder "
            "(default: the current one).",
        ),
    ] = None,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: KeyOpt = None,
) -> None:
    """Write the experiment's rollouts as JSONL, ATIF trajectories (Harbor) or Inspect logs
    (`inspect view --log-dir FOLDER` opens them)."""
    api, path = Api(server, api_key), f"/v1/experiments/{experiment_id}/export"
    if format == "jsonl":
        text = api.call("GET", path).text
        if out is None:
            typer.echo(text, nl=False)
        else:
            out.write_text(text, encoding="utf-8")
        return
    folder = out or Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    if format == "atif":
        archive = api.call("GET", path, params={"format": "atif"}).content
        with zipfile.ZipFile(io.BytesIO(archive)) as files:
            files.extractall(folder)  # names the server made: `<experiment>/<arm>/<file>`
            typer.echo(
                f"{len(files.namelist())} trajectories in {folder / experiment_id}", err=True
            )
        return
    arms = [arm["name"] for arm in api.json("GET", f"/v1/experiments/{experiment_id}")["arms"]]
    for arm in arms:
        log = api.call("GET", path, params={"format": "inspect", "arm": arm}).content
        (folder / f"{experiment_id}-{arm}.eval").write_bytes(log)
    # Unwrapped (not the rich console): the command is for pasting, paths may be long.
    typer.echo(f"{len(arms)} Inspect logs in {folder}: inspect view --log-dir {folder}", err=True)
