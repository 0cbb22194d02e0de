"""`sandhive run`: the worker's episode in one process, with no Postgres and no Redis.

Prints each step to the terminal as it happens (`app.runner.run_display`), closes with a
summary, and leaves, like the paper's own command line tool,
`<output>/<YYYYMMDD_HHMMSS>/files/` and `trajectory.json` in the reference
package's format (REFERENCE.md §1.7).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from app.config import Settings
from app.domain.resolve import parse_submission, resolve_spec
from app.domain.trajectory_format import reference_trajectory
from app.runner.episode import EpisodeResult, Runner, open_runner
from app.runner.exchange_log import ExchangeLog
from app.runner.run_display import Summary, TerminalSink, summary_panel
from app.sandbox.files import CollectedFile
from app.specs import TaskSpec


def local_labels() -> dict[str, str]:
    """What marks a sandbox of this process (`sandhive run`, `experiment run --local`).

    `sandhive.local` keeps deployments' reapers away from it, the pid says whose it is (read
    at each call: a forked process is not its parent).
    """
    return {"sandhive.local": "1", "sandhive.local.pid": str(os.getpid())}


def resolve_run(settings: Settings, options: Mapping[str, Any]) -> TaskSpec:
    """`sandhive run`'s options (a submission's JSON) resolved exactly as the API resolves
    a submission: the same defaults, maxima and errors (InvalidInput)."""
    return resolve_spec(parse_submission(options), settings)


async def run_local(
    settings: Settings,
    spec: TaskSpec,
    prompt: str,
    console: Console,
    *,
    output_root: Path,
    inputs: Sequence[tuple[str, bytes]] = (),
    save_exchanges: bool = False,
) -> tuple[EpisodeResult, Path]:
    """Run one resolved task locally, write its outputs and close with a summary panel;
    returns the result and run folder. `save_exchanges`: every model request and response
    too (`request_NNN.json`, `response_NNN.json`)."""
    started = time.monotonic()
    log = ExchangeLog() if save_exchanges else None
    async with _runner(settings, log) as runner:
        result = await runner.run(
            spec, prompt, TerminalSink(console), labels=local_labels(), inputs=inputs
        )
    elapsed = time.monotonic() - started
    folder = write_outputs(output_root, prompt, result)
    if log is not None:
        log.write(folder)
    answer = result.answer(settings.answer_max_bytes)
    console.print(summary_panel(Summary(result.outcome, answer, elapsed)))
    # One line however long, so that the path can be copied from the terminal whole.
    console.print(f"outputs: {folder}", markup=False, highlight=False, soft_wrap=True)
    return result, folder


@asynccontextmanager
async def _runner(settings: Settings, log: ExchangeLog | None) -> AsyncIterator[Runner]:
    """The worker's runner; with a log, its model calls go through the log's HTTP client."""
    if log is None:
        async with open_runner(settings) as runner:
            yield runner
        return
    from app.sandbox import DockerHost

    async with (
        DockerHost(exec_channel=settings.sandbox_exec_channel) as docker,
        log.client() as http,
    ):
        yield Runner(settings, docker, http=http)


def write_outputs(root: Path, prompt: str, result: EpisodeResult) -> Path:
    """`<root>/<timestamp>/files/` and `trajectory.json`, as the reference package leaves them."""
    folder = _new_run_folder(root)
    files_dir = folder / "files"
    files_dir.mkdir()
    for item in result.files:
        _write_file(files_dir, item)
    trajectory = reference_trajectory(prompt, result.outcome.steps)
    (folder / "trajectory.json").write_text(
        json.dumps(trajectory, indent=2, ensure_ascii=False), encoding="utf-8"
    )
    return folder


def _new_run_folder(root: Path) -> Path:
    """`<YYYYMMDD_HHMMSS>` like the package; `_2`, `_3`... when a run already took that second."""
    stamp = datetime.now().strftime("%Y%m%d_%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        folder = root / (stamp if attempt == 1 else f"{stamp}_{attempt}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"no free run folder for {stamp} in {root}")


def _write_file(files_dir: Path, item: CollectedFile) -> None:
    # The collector already refused absolute and escaping names; check again at the host edge.
    target = (files_dir / item.path).resolve()
    if not target.is_relative_to(files_dir.resolve()):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(item.content)
