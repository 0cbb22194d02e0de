"""Inspect out: one arm of an experiment as an Inspect eval log (`.eval`), written by
inspect-ai's own `write_eval_log` so that `inspect view` and `read_eval_log` open it.

inspect-ai is an optional extra (`pip install 'sandhive[inspect]'`): it is imported when a
log is asked for, and a server without it answers 501 naming the extra. An Inspect log is
one task run against one model, so an experiment gives one log per arm: its samples are
the arm's started items (the row's id, the experiment attempt as Inspect's epoch), each
with the row's prompt and ground truth, the conversation as chat messages, and the item's
score under the experiment's scorer. An item the service could not score (an
infrastructure or scorer failure, or cancelled) carries Inspect's sample `error` and no
score, as Inspect marks a sample that failed to run; an agent that gave no answer scores
0, as everywhere in Sandhive. The log is built in memory (one arm's samples) and written
to a temporary file, whose bytes are returned.
"""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from app.db import models
from app.db.engine import Sessions
from app.errors import NotInstalled
from app.services.experiments.rows import ROW_VALUE, with_rows
from app.services.experiments.service import find_experiment
from app.services.rollouts.export import (
    Record,
    arms_of,
    open_experiment_records,
    rollout_line,
)

if TYPE_CHECKING:
    from inspect_ai.log import EvalSample

Item = models.ExperimentItem
MEDIA_TYPE = "application/octet-stream"
ZIP = "application/zip"
EXTRA = "sandhive[inspect]"


@dataclass(frozen=True)
class Exported:
    """What the export answers: a log, or a zip of one log per arm."""

    content: bytes
    media_type: str
    filename: str


async def inspect_export(
    sessions: Sessions, tenant: str, experiment_id: str, arm: str | None
) -> Exported:
    """`arm`'s `.eval` log; without `arm`, the only arm's, or a zip of every arm's
    (`<experiment>-<arm>.eval`). An arm the experiment does not have is a 404."""
    try:
        from inspect_ai.log import write_eval_log_async  # noqa: F401 (checked first)
    except ImportError as error:
        raise NotInstalled(
            f"Inspect logs need inspect-ai on the server: install `{EXTRA}`"
        ) from error
    async with sessions() as session:
        exp = await find_experiment(session, tenant, experiment_id)
    logs = {name: await _arm_log(sessions, tenant, exp, name) for name in arms_of(exp, arm)}
    if len(logs) == 1:
        ((name, log),) = logs.items()
        return Exported(log, MEDIA_TYPE, f"{exp.id}-{name}.eval")
    folder = io.BytesIO()
    with zipfile.ZipFile(folder, "w") as archive:  # .eval logs are zips already: stored
        for name, log in logs.items():
            archive.writestr(f"{exp.id}-{name}.eval", log)
    return Exported(folder.getvalue(), ZIP, f"{exp.id}-inspect.zip")


async def _arm_log(sessions: Sessions, tenant: str, exp: models.Experiment, arm: str) -> bytes:
    records = await open_experiment_records(sessions, tenant, exp.id, arm=arm, with_prompt=True)
    collected = [record async for record in records]
    targets = await _targets(sessions, exp.id, arm)
    return await _write(exp, arm, collected, targets)


async def _targets(sessions: Sessions, experiment_id: str, arm: str) -> dict[str, Any]:
    """Each started item's ground truth by task id (that field of the row, not the row)."""
    async with sessions() as session:
        found = await session.execute(
            with_rows(select(Item.task_id, ROW_VALUE["ground_truth"]))
            .where(Item.experiment_id == experiment_id, Item.arm == arm)
            .where(Item.task_id.is_not(None))
        )
        return {task_id: truth for task_id, truth in found.all()}


async def _write(
    exp: models.Experiment, arm: str, records: Sequence[Record], targets: Mapping[str, Any]
) -> bytes:
    from inspect_ai.log import (
        EvalConfig,
        EvalDataset,
        EvalLog,
        EvalMetric,
        EvalResults,
        EvalScore,
        EvalSpec,
        EvalStats,
        write_eval_log_async,
    )

    scorer = str(exp.spec.get("scorer", {}).get("kind", "score"))
    lines = [rollout_line(record) for record in records]  # each once: a rebuild is costly
    samples = [
        _sample(record, line, targets.get(record.task.id), scorer)
        for record, line in zip(records, lines, strict=True)
    ]
    scored = [float(line["reward"]) for line in lines if line["reward"] is not None]
    models_seen = sorted({str(line["model"] or "") for line in lines} - {""})
    # No mean of nothing: an arm with no scored sample has no metric, not a 0.
    metrics = {"mean": EvalMetric(name="mean", value=sum(scored) / len(scored))} if scored else {}
    log = EvalLog(
        status="success" if exp.status == "finished" else "started",
        eval=EvalSpec(
            created=exp.created_at.isoformat(),
            task=f"{exp.name}/{arm}",
            task_id=f"{exp.id}-{arm}",
            run_id=exp.id,
            dataset=EvalDataset(
                name=exp.name,
                samples=len({r.placed[0].row_id for r in records if r.placed}),
            ),
            model=models_seen[0] if models_seen else "unknown",
            config=EvalConfig(epochs=int(exp.spec.get("attempts", 1))),
            metadata={"sandhive_experiment": exp.id, "arm": arm},
        ),
        results=EvalResults(
            total_samples=len(samples),
            completed_samples=len(scored),
            scores=[
                EvalScore(
                    name=scorer,
                    scorer=scorer,
                    scored_samples=len(scored),
                    unscored_samples=len(samples) - len(scored),
                    metrics=metrics,
                )
            ],
        ),
        stats=EvalStats(
            started_at=exp.created_at.isoformat(),
            completed_at=exp.finished_at.isoformat() if exp.finished_at else "",
        ),
        samples=samples,
    )
    with tempfile.TemporaryDirectory(prefix="sandhive-inspect-") as folder:
        path = Path(folder) / f"{exp.id}-{arm}.eval"
        await write_eval_log_async(log, str(path), format="eval")
        return path.read_bytes()


def _sample(record: Record, line: Mapping[str, Any], truth: Any, scorer: str) -> EvalSample:
    """One item as a sample; `line`: its rollout line (`export.rollout_line`)."""
    from inspect_ai._util.error import EvalError
    from inspect_ai.log import EvalSample
    from inspect_ai.scorer import Score

    item = record.placed[0] if record.placed else None
    reward = line["reward"]
    scores = None
    error = None
    if reward is not None:
        scores = {scorer: Score(value=float(reward), answer=line["answer"])}
    elif item is not None and item.status in ("error", "cancelled"):
        why = f"not scored: {item.status}" + (f" ({item.error_kind})" if item.error_kind else "")
        error = EvalError(
            message=f"{why}: {line['error'] or ''}".rstrip(": "),
            traceback="",
            traceback_ansi="",
        )
    return EvalSample(
        id=item.row_id if item else record.task.id,
        epoch=item.attempt if item else 1,
        input=record.task.prompt,
        target=_target(truth),
        messages=_messages(record.task.prompt, line),
        scores=scores,
        error=error,
        metadata={
            "task_id": record.task.id,
            "finish_reason": line["finish_reason"],
            "infrastructure_failure": line["infrastructure_failure"],
        },
    )


def _target(truth: Any) -> str | list[str]:
    """Inspect's target is text or a list of texts; other ground truths as their JSON."""
    if isinstance(truth, str):
        return truth
    if isinstance(truth, list) and all(isinstance(t, str) for t in truth):
        return list(truth)
    return "" if truth is None else json.dumps(truth, ensure_ascii=False)


def _messages(prompt: str, line: Mapping[str, Any]) -> list[Any]:
    """The user's prompt, then per model call the assistant's text and tool call and the
    tool's output (the conversation as the agent saw it, without the system prompt when
    the rollout was not captured)."""
    from inspect_ai.model import (
        ChatMessageAssistant,
        ChatMessageSystem,
        ChatMessageTool,
        ChatMessageUser,
    )
    from inspect_ai.tool import ToolCall

    out: list[Any] = []
    captured = line.get("messages") or []
    if captured and captured[0].get("role") == "system":
        out.append(ChatMessageSystem(content=str(captured[0].get("content") or "")))
    out.append(ChatMessageUser(content=prompt))
    for turn in line["turns"]:
        call = turn["tool_call"]
        call_id = f"call_{turn['index']}"
        calls = None
        if call is not None:
            arguments = call.get("arguments")
            calls = [
                ToolCall(
                    id=call_id,
                    function=str(call.get("tool", "")),
                    arguments=arguments if isinstance(arguments, dict) else {"raw": arguments},
                )
            ]
        out.append(ChatMessageAssistant(content=turn["thought"] or "", tool_calls=calls))
        if call is not None:
            out.append(
                ChatMessageTool(
                    content=turn["observation"] or "",
                    tool_call_id=call_id,
                    function=str(call.get("tool", "")),
                )
            )
    return out
