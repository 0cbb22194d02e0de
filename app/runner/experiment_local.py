"""`sandhive experiment run --local`: an experiment in this one process, no Postgres or Redis.

Every row x arm x attempt is resolved as the service resolves an item's task
(`app.domain.resolve`: the same defaults, maxima and 422s) and run by the same `Runner` as
`sandhive run`, at most `concurrency` at once; built-in scorers score in-process, the
`python` scorer in a fresh sandbox (`app.sandbox.python_scorer.score`), never here. The report
is the service's (`app.domain.experiment_report`), and the run folder keeps what the package's
benchmark leaves (REFERENCE.md §1.9) for each arm, plus the report and the items.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from app.agent.types import Step
from app.config import Settings
from app.domain.experiment_report import arm_result, compare
from app.domain.resolve import check_inputs, parse_submission, resolve_spec
from app.domain.scored_answer import AGENT_REASONS, scored_answer
from app.domain.trajectory_format import reference_trajectory
from app.errors import InvalidInput, TooLarge
from app.runner.episode import Runner, open_runner
from app.runner.local import local_labels
from app.schemas.experiments import (
    ArmProgress,
    ExperimentCreate,
    PackageArm,
    PackageConfig,
    ResultsOut,
)
from app.scoring.registry import scorer_for
from app.scoring.types import Score, Scorer, ScorerError, from_task, is_deferred, score_answer
from app.states import TaskStatus, status_for

PLACEHOLDER = "(each row's problem_statement)"


@dataclass
class LocalItem:
    """One row x arm x attempt run here; read by the report as a stored item is."""

    row_id: str
    arm: str
    attempt: int
    row: dict[str, Any]
    status: str = "pending"
    score: float | None = None
    error_kind: str | None = None
    answer: str | None = None
    task_id: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    steps: int = 0
    seconds: float = 0.0
    retries: int = 0
    detail: dict[str, Any] = field(default_factory=dict)
    trajectory: list[Step] = field(default_factory=list)

    def out(self) -> dict[str, Any]:
        """As `GET /v1/experiments/{id}/items` lists it."""
        data = asdict(self)
        for key in ("row", "trajectory"):
            data.pop(key)
        return data


@dataclass
class LocalRun:
    body: ExperimentCreate
    items: list[LocalItem]
    started: float = field(default_factory=time.monotonic)
    elapsed_s: float = 0.0

    def progress(self) -> dict[str, ArmProgress]:
        counts = {arm.name: ArmProgress() for arm in self.body.arms}
        for item in self.items:
            progress = counts[item.arm]
            setattr(progress, item.status, getattr(progress, item.status) + 1)
        return counts

    def results(self) -> ResultsOut:
        names = [arm.name for arm in self.body.arms]
        by_arm = {name: [i for i in self.items if i.arm == name] for name in names}
        return ResultsOut(
            experiment_id="local",
            status="finished",
            arms=[arm_result(name, by_arm[name], self.body.attempts) for name in names],
            pairs=[
                pair
                for a, b in itertools.combinations(names, 2)
                if (pair := compare(a, by_arm[a], b, by_arm[b])) is not None
            ],
        )


def plan(settings: Settings, data: Mapping[str, Any]) -> tuple[LocalRun, Scorer]:
    """The experiment checked as far as this process can (InvalidInput/ValueError saying
    what is wrong), with its items in the service's start order: attempt, row, arm."""
    body = ExperimentCreate.model_validate(data)
    scorer = scorer_for(body.scorer)
    if from_task(scorer):  # its rows' images and verifiers are the service's to run
        raise ValueError("scorer 'verifier' runs on a service, not with --local")
    for arm in body.arms:  # each arm's options resolve as a task submission would
        resolve_spec(parse_submission(_submission(arm.model_dump(), PLACEHOLDER, {})), settings)
    items = [
        LocalItem(row_id=str(row["id"]), arm=arm.name, attempt=attempt, row=dict(row))
        for attempt in range(1, body.attempts + 1)
        for row in body.dataset.rows
        for arm in body.arms
    ]
    return LocalRun(body, items), scorer


async def run(
    settings: Settings,
    local: LocalRun,
    scorer: Scorer,
    *,
    on_change: Callable[[LocalRun], None] = lambda _: None,
) -> LocalRun:
    """Run every item, `concurrency` at once; `on_change` after each start and end."""
    arms = {arm.name: arm.model_dump() for arm in local.body.arms}
    slots = asyncio.Semaphore(local.body.concurrency)
    async with open_runner(settings) as runner:

        async def one(number: int, item: LocalItem) -> None:
            async with slots:
                item.status, item.task_id = "running", f"local-{number}"
                on_change(local)
                for retry in range(local.body.infrastructure_retries + 1):  # as the service
                    if retry:  # its backoff, doubled at each further retry
                        await asyncio.sleep(settings.experiment_retry_backoff_s * 2 ** (retry - 1))
                    item.retries, item.error_kind, item.score, item.detail = retry, None, None, {}
                    await _run_item(
                        runner, settings, arms[item.arm], item, scorer, local.body.rules
                    )
                    on_change(local)
                    if not _failed_by_service(item):
                        break

        await asyncio.gather(*(one(n, item) for n, item in enumerate(local.items, 1)))
    local.elapsed_s = time.monotonic() - local.started
    return local


def _failed_by_service(item: LocalItem) -> bool:
    """Its task ended for the service's failure: an infrastructure error with the task's
    finish reason (a task refused before it ran has none, and would be refused again)."""
    return item.error_kind == "infrastructure" and item.detail.get("reason") is not None


async def _run_item(
    runner: Runner,
    settings: Settings,
    arm: Mapping[str, Any],
    item: LocalItem,
    scorer: Scorer,
    rules: str,
) -> None:
    prompt, files = _item_prompt(arm, item.row)
    try:
        body = parse_submission(_submission(arm, prompt, files))
        spec = resolve_spec(body, settings)
        inputs = check_inputs(body, settings)
    except (InvalidInput, TooLarge) as exc:
        _error(item, "infrastructure", f"the task was refused: {exc.message}")
        return
    started = time.monotonic()
    result = await runner.run(spec, prompt, _QuietSink(), labels=local_labels(), inputs=inputs)
    outcome = result.outcome
    item.seconds = time.monotonic() - started
    usage = outcome.usage
    item.prompt_tokens, item.completion_tokens = usage.prompt_tokens, usage.completion_tokens
    item.steps, item.trajectory = usage.steps, list(outcome.steps)
    item.answer = result.answer(settings.answer_max_bytes)
    status = status_for(outcome.finish_reason)
    to_score = scored_answer(
        status,
        outcome.finish_reason,
        item.answer,
        package=rules == "package",
        sandbox=arm["mode"] == "sandbox",
    )
    if status is TaskStatus.cancelled:
        item.status = "cancelled"
    elif to_score is not None:
        item.answer = to_score
        await _score(runner, settings, item, to_score, scorer)
    elif status is not TaskStatus.succeeded:
        kind = "agent" if outcome.finish_reason in AGENT_REASONS else "infrastructure"
        error = outcome.error or f"the task ended with {outcome.finish_reason}"
        _error(item, kind, error, reason=str(outcome.finish_reason), retries=item.retries)
    else:
        _error(item, "agent", "the agent gave no answer (no answer.txt in its output dir)")


async def _score(
    runner: Runner, settings: Settings, item: LocalItem, answer: str, scorer: Scorer
) -> None:
    try:
        if is_deferred(scorer):
            score = await _score_deferred(runner, settings, scorer, answer, item.row)
        else:
            score = score_answer(scorer, answer, item.row)
    except ScorerError as exc:
        _error(item, "scorer", exc.message, **exc.detail)
        return
    item.status, item.score, item.detail = "scored", score.value, dict(score.detail)


async def _score_deferred(
    runner: Runner, settings: Settings, scorer: Scorer, answer: str, row: Mapping[str, Any]
) -> Score:
    """The `python` scorer in a fresh sandbox of its own; other slow scorers need the service."""
    if scorer.kind != "python":
        raise ScorerError(f"scorer {scorer.kind!r} runs on the service only, not with --local")
    from app.sandbox.python_scorer.score import score_in_sandbox
    from app.scoring.python_code import PythonScorer

    assert isinstance(scorer, PythonScorer)
    return await score_in_sandbox(  # labelled like the run's own sandboxes: outside a deployment
        runner.docker, settings.sandbox_image, scorer, answer, row, labels=local_labels()
    )


def _error(item: LocalItem, kind: str, message: str, **detail: Any) -> None:
    item.status, item.error_kind, item.detail = "error", kind, {"message": message, **detail}


def _item_prompt(arm: Mapping[str, Any], row: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """As the service: the row's problem and files, or the arm's `prompt_field` (a whole
    message, so a vanilla arm embeds no files again)."""
    files = _files(row.get("input_files"))
    field_name = arm.get("prompt_field")
    if field_name is None:
        return str(row["problem_statement"]), files
    return str(row[field_name]), {} if arm["mode"] == "vanilla" else files


def _files(value: object) -> dict[str, str]:
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else {}
    if not isinstance(value, dict):
        return {}
    return {str(path): text for path, text in value.items() if isinstance(text, str)}


def _submission(arm: Mapping[str, Any], prompt: str, files: Mapping[str, str]) -> dict[str, Any]:
    return {
        **arm["task"],
        "prompt": prompt,
        "mode": arm["mode"],
        "input_files": [
            {"path": path, "content_base64": base64.b64encode(text.encode()).decode()}
            for path, text in files.items()
        ],
    }


class _QuietSink:
    """Steps go nowhere while they happen: the progress bars say how far the run is."""

    async def step_started(self, index: int) -> None:
        return None

    async def step_completed(self, step: Step, next_index: int | None = None) -> None:
        return None

    async def live(self, kind: str, data: Mapping[str, object]) -> None:
        return None


# The run folder


def write_run(root: Path, task: str, local: LocalRun, settings: Settings) -> Path:
    """`<root>/<YYYYMMDD_HHMMSS>_<task>/`: `report.json` (the service's results), `items.json`,
    and per arm `<arm>/results.json` and `<arm>/trajectory.json` in the package's shapes."""
    folder = _new_folder(root, f"{datetime.now():%Y%m%d_%H%M%S}_{task}")
    _dump(folder / "report.json", local.results().model_dump(mode="json"))
    _dump(folder / "items.json", {"items": [item.out() for item in local.items]})
    for arm in local.body.arms:
        items = [item for item in local.items if item.arm == arm.name]
        arm_dir = folder / arm.name
        arm_dir.mkdir()
        summary = _package_arm(task, arm.model_dump(), items, local.elapsed_s, settings)
        _dump(arm_dir / "results.json", summary.model_dump(mode="json"))
        _dump(arm_dir / "trajectory.json", _package_trajectories(items, local.body.attempts))
    return folder


def _package_arm(
    task: str,
    arm: Mapping[str, Any],
    items: list[LocalItem],
    elapsed_s: float,
    settings: Settings,
) -> PackageArm:
    """The package's `results.json`: an error counts as a 0 in `mean_score`, as there."""
    llm = arm["task"].get("llm", {})
    limits = arm["task"].get("limits", {})
    sandbox = arm["mode"] == "sandbox"
    scores = [item.score or 0.0 for item in items]
    return PackageArm(
        config=PackageConfig(
            mode="llm-in-sandbox" if sandbox else "llm",
            docker_image=settings.sandbox_image if sandbox else None,
            llm_name=llm.get("model") or settings.llm_model or None,
            llm_base_url=None,
            max_steps=limits.get("max_steps", settings.default_max_steps) if sandbox else None,
            temperature=llm.get("temperature"),
            max_token_limit=None,
            max_tokens_per_call=llm.get("max_tokens_per_call"),
            max_response_len=None,
            extra_body=llm.get("extra_body"),
            save_litellm_response=None,
        ),
        task=task,
        total=len(items),
        mean_score=sum(scores) / len(scores) if scores else 0.0,
        num_errors=sum(item.status == "error" for item in items),
        elapsed_time_seconds=elapsed_s,
    )


def _package_trajectories(items: list[LocalItem], attempts: int) -> dict[str, Any]:
    """`{problem_id: {problem_statement, trajectory, reward, agent_answer, ground_truth}}`;
    with several attempts each is its own problem, `<id>_<attempt>`."""
    out: dict[str, Any] = {}
    for item in items:
        key = item.row_id if attempts == 1 else f"{item.row_id}_{item.attempt}"
        statement = str(item.row.get("problem_statement", ""))
        out[key] = {
            "problem_statement": statement,
            "trajectory": reference_trajectory(statement, item.trajectory)["steps"],
            "reward": item.score or 0.0,
            "agent_answer": item.answer or "",
            "ground_truth": item.row.get("ground_truth"),
        }
    return out


def _new_folder(root: Path, name: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        folder = root / (name if attempt == 1 else f"{name}_{attempt}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"no free run folder for {name} in {root}")


def _dump(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
