"""An experiment's submission checked up-front, and each item's task submission built from it.

Pure (no I/O). Every problem is reported at once, located like a request-validation error
(`dataset.rows.3.ground_truth`, `arms.1.task.limits.max_steps`) and naming the row, so a
bad experiment is a 422 with nothing created (invariant 7). Imported by services only.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from app.config import Settings
from app.domain.resolve import (
    OwnImage,
    Problem,
    check_inputs,
    dotted,
    problem,
    resolve_spec,
)
from app.errors import InvalidInput, TooLarge
from app.schemas.experiments import ArmCreate, ExperimentCreate
from app.schemas.tasks import TaskCreate
from app.scoring.python_code import PythonLimits
from app.scoring.registry import scorer_for
from app.scoring.types import Scorer
from app.services.experiments.scoring import scorer_problems

PLACEHOLDER_PROMPT = "(each row's problem_statement)"
RowContext = tuple[str | None, Mapping[str, OwnImage], Sequence[Mapping[str, Any]]]
"""What a row's own `image` and `verifier` are checked with: the tenant, its own images and
the experiment's arms (as stored)."""
SET_PER_ROW = ("prompt", "input_files", "mode")
MAX_ROW_ID_CHARS = 200


@dataclass(frozen=True)
class Checked:
    """A valid experiment: its arms as stored, its rows normalised, its scorer spec."""

    arms: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    scorer: dict[str, Any]


def check_experiment(
    body: ExperimentCreate,
    settings: Settings,
    tenant: str | None = None,
    own: Mapping[str, OwnImage] | None = None,
) -> Checked:
    """The experiment, every row and arm checked; InvalidInput listing every problem.
    `tenant`: whose catalogue images the arms and rows may use (None: any, `--local`);
    `own`: the tenant's own images (`built/NAME`) they may use besides."""
    problems: list[Problem] = []
    _check_sizes(body, settings, problems)
    scorer = _scorer(body.scorer, settings, problems)
    arms = [_check_arm(i, arm, settings, problems, tenant, own) for i, arm in enumerate(body.arms)]
    _unique_arm_names(body.arms, problems)
    rows = _check_rows(body.dataset.rows, scorer, settings, problems, (tenant, own or {}, arms))
    rows = _slice(rows, body.start_id, body.end_id, problems)
    _check_prompt_fields(body, settings, problems)
    if problems:
        raise InvalidInput(_summary(problems), details=problems)
    return Checked(arms=arms, rows=rows, scorer=dict(body.scorer))


def _check_sizes(body: ExperimentCreate, s: Settings, problems: list[Problem]) -> None:
    rows, arms = len(body.dataset.rows), len(body.arms)
    for loc, value, limit in (
        (("dataset", "rows"), rows, s.experiment_max_rows),
        (("arms",), arms, s.experiment_max_arms),
        (("attempts",), body.attempts, s.experiment_max_attempts),
        (("concurrency",), body.concurrency, s.experiment_max_concurrency),
    ):
        if value > limit:
            msg = f"at most {limit} allowed, got {value}"
            problems.append(problem(loc, msg, "too_many", limit=limit))
    meta_size = len(json.dumps(body.metadata, separators=(",", ":")).encode())
    if meta_size > s.max_metadata_bytes:
        msg = f"larger than {s.max_metadata_bytes} bytes as JSON"
        problems.append(problem(("metadata",), msg, "too_large", limit=s.max_metadata_bytes))
    items = rows * arms * body.attempts
    if items > s.experiment_max_items:
        msg = f"rows x arms x attempts is {items}, more than {s.experiment_max_items}"
        problems.append(problem(("dataset", "rows"), msg, "too_many"))


def _scorer(spec: Mapping[str, Any], s: Settings, problems: list[Problem]) -> Scorer | None:
    try:
        scorer = scorer_for(spec, python_limits=PythonLimits.from_settings(s))
    except ValueError as exc:
        problems.append(problem(("scorer",), str(exc)))
        return None
    problems.extend(scorer_problems(scorer, s))  # an llm_judge's profile and model
    return scorer


def _unique_arm_names(arms: list[ArmCreate], problems: list[Problem]) -> None:
    seen: set[str] = set()
    for i, arm in enumerate(arms):
        if arm.name in seen:
            problems.append(problem(("arms", i, "name"), f"duplicate arm name {arm.name!r}"))
        seen.add(arm.name)


# Arms: each one's task options must resolve as a task submission would


def _check_arm(
    i: int,
    arm: ArmCreate,
    settings: Settings,
    problems: list[Problem],
    tenant: str | None,
    own: Mapping[str, OwnImage] | None,
) -> dict[str, Any]:
    stored = {"name": arm.name, "mode": arm.mode, "task": dict(arm.task)}
    if arm.prompt_field is not None:
        stored["prompt_field"] = arm.prompt_field
    given = [key for key in SET_PER_ROW if key in arm.task]
    for key in given:
        msg = "set by the experiment (each row's problem_statement, input_files; the arm's mode)"
        problems.append(problem(("arms", i, "task", key), msg))
    if "webhook" in arm.task:  # an item's task is not submitted by the caller
        msg = "items' tasks have no own webhook: set the experiment's `webhook`, or subscribe"
        problems.append(problem(("arms", i, "task", "webhook"), msg))
        return stored
    if given:
        return stored
    try:
        body = arm_submission(stored, PLACEHOLDER_PROMPT, {}, {})
        stored["llm_profile"] = resolve_spec(body, settings, tenant=tenant, own=own).llm.profile
        check_inputs(body, settings)  # the arm's metadata
    except ValidationError as exc:
        for e in exc.errors():
            msg = e["msg"].removeprefix("Value error, ")
            problems.append(problem(("arms", i, "task", *e["loc"]), msg, e["type"]))
    except (InvalidInput, TooLarge) as exc:
        problems.extend(_relocated(exc, ("arms", i, "task")))
    return stored


def arm_submission(
    arm: Mapping[str, Any],
    prompt: str,
    files: Mapping[str, str],
    metadata: Mapping[str, Any],
    row: Mapping[str, Any] | None = None,
) -> TaskCreate:
    """The task one item of `arm` submits: the arm's options, the row's prompt and files,
    and the row's own `image` and `verifier` when it has them (a Harbor task's)."""
    task = {**arm["task"], **row_task(row or {}, arm["task"])}
    own = task.get("metadata", {})
    data: dict[str, Any] = {
        **task,
        "prompt": prompt,
        "input_files": [
            {"path": path, "content_base64": base64.b64encode(text.encode()).decode()}
            for path, text in files.items()
        ],
        "metadata": {**own, **metadata} if isinstance(own, dict) else own,  # else: a 422
    }
    if "mode" in TaskCreate.model_fields:  # vanilla arms: one model call, no sandbox
        data["mode"] = arm["mode"]
    return TaskCreate.model_validate(data)


def row_task(row: Mapping[str, Any], task: Mapping[str, Any]) -> dict[str, Any]:
    """The task options a row sets over its arm's: `image` (the sandbox's) and `verifier`
    (its files as text by path under /tests)."""
    options: dict[str, Any] = {}
    if "image" in row:
        sandbox = task.get("sandbox")
        options["sandbox"] = {**(sandbox if isinstance(sandbox, Mapping) else {})}
        options["sandbox"]["image"] = row["image"]
    verifier = row.get("verifier")
    if isinstance(verifier, Mapping):
        files = verifier.get("files")
        options["verifier"] = {
            **{key: value for key, value in verifier.items() if key != "files"},
            "files": [
                {"path": path, "content_base64": base64.b64encode(text.encode()).decode()}
                for path, text in (files.items() if isinstance(files, Mapping) else ())
                if isinstance(text, str)
            ],
        }
    return options


def item_prompt(arm: Mapping[str, Any], row: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """An item's prompt and input files: the row's problem statement and files, or the
    arm's `prompt_field` (a whole message: a vanilla arm then embeds no files again)."""
    field = arm.get("prompt_field")
    if field is None:
        return row["problem_statement"], row["input_files"]
    return row[field], {} if arm["mode"] == "vanilla" else row["input_files"]


def _check_prompt_fields(body: ExperimentCreate, s: Settings, problems: list[Problem]) -> None:
    """Every row carries the text of each arm's `prompt_field`, within a prompt's limit."""
    fields = {arm.prompt_field for arm in body.arms if arm.prompt_field is not None}
    for i, row in enumerate(body.dataset.rows):
        for name in sorted(fields):
            value = row.get(name)
            if not isinstance(value, str) or not value.strip():
                msg = f"row {row.get('id')!r}: an arm's prompt_field {name!r} must be text here"
                problems.append(problem(("dataset", "rows", i, name), msg, "missing"))
            elif len(value) > s.max_prompt_chars:
                msg = f"row {row.get('id')!r}: longer than {s.max_prompt_chars} characters"
                problems.append(problem(("dataset", "rows", i, name), msg, "too_long"))


# Rows: ids, problem statements, ground truths, input files


def _check_rows(
    rows: list[dict[str, Any]],
    scorer: Scorer | None,
    settings: Settings,
    problems: list[Problem],
    images: RowContext,
) -> list[dict[str, Any]]:
    first_at: dict[str, int] = {}
    checked = []
    for i, row in enumerate(rows):
        found = _check_row(i, row, scorer, problems)
        if found is None:
            continue
        row_id = found["id"]
        if row_id in first_at:
            msg = f"duplicate id {row_id!r} (first at row {first_at[row_id]})"
            problems.append(problem(("dataset", "rows", i, "id"), msg, "duplicate"))
            continue
        first_at[row_id] = i
        _check_row_inputs(i, found, settings, problems, images)
        checked.append(found)
    return checked


def _check_row(
    i: int, row: Mapping[str, Any], scorer: Scorer | None, problems: list[Problem]
) -> dict[str, Any] | None:
    """The row with a string id and its files as an object; None (and problems) if unusable."""
    loc = ("dataset", "rows", i)
    row_id = _row_id(row.get("id"))
    if row_id is None:
        problems.append(problem((*loc, "id"), f"row {i}: id must be a non-empty string or integer"))
        return None
    statement = row.get("problem_statement")
    if not isinstance(statement, str) or not statement.strip():
        msg = f"row {row_id!r}: problem_statement must be a non-empty string"
        problems.append(problem((*loc, "problem_statement"), msg))
        return None
    files = _input_files(row.get("input_files"))
    if files is None:
        msg = f"row {row_id!r}: input_files must map paths to text (an object or a JSON string)"
        problems.append(problem((*loc, "input_files"), msg))
        return None
    normalised = {**row, "id": row_id, "input_files": files}
    return normalised if _scorable(i, normalised, scorer, problems) else None


def _row_id(value: object) -> str | None:
    if isinstance(value, float) and value.is_integer():  # JSON's 7.0 is the integer 7
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    text = str(value)
    return text if text.strip() and len(text) <= MAX_ROW_ID_CHARS else None


def _input_files(value: object) -> dict[str, str] | None:
    """The row's files as the package reads them: an object or a JSON string of one, with
    `null` (the field, or a file's content, as a Hub export fills holes) meaning none."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            return None
    if value is None:
        return {}
    if not isinstance(value, dict):
        return None
    files = {path: text for path, text in value.items() if text is not None}
    return files if all(isinstance(text, str) for text in files.values()) else None


def row_problems(rows: Sequence[Mapping[str, Any]], scorer: Scorer) -> list[Problem]:
    """What stored rows lack for `scorer` (a regrade's check), exactly as creation checks."""
    problems: list[Problem] = []
    for i, row in enumerate(rows):
        _scorable(i, dict(row), scorer, problems)
    return problems


def _scorable(i: int, row: dict[str, Any], scorer: Scorer | None, problems: list[Problem]) -> bool:
    loc = ("dataset", "rows", i)
    if scorer is None:
        return True
    if scorer.needs_ground_truth and row.get("ground_truth") in (None, "", []):
        msg = f"row {row['id']!r}: scorer {scorer.kind!r} needs a ground_truth"
        problems.append(problem((*loc, "ground_truth"), msg, "missing"))
        return False
    validate = getattr(scorer, "validate_row", None)
    if validate is not None:
        try:
            validate(row)
        except ValueError as exc:
            problems.append(problem(loc, f"row {row['id']!r}: {exc}"))
            return False
    return True


def _check_row_inputs(
    i: int,
    row: Mapping[str, Any],
    settings: Settings,
    problems: list[Problem],
    context: RowContext,
) -> None:
    """The row's prompt and files within a task's limits (which no arm option changes),
    and its own image and verifier, when it has them, as each arm's task would take them
    (an arm's resources within the row image's maxima, say)."""
    loc = ("dataset", "rows", i)
    bare = {"name": "", "mode": "sandbox", "task": {}}
    try:
        check_inputs(
            arm_submission(bare, row["problem_statement"], row["input_files"], {}, row), settings
        )
    except ValidationError as exc:
        for e in exc.errors():
            msg = f"row {row['id']!r}: {e['msg'].removeprefix('Value error, ')}"
            problems.append(problem((*loc, *e["loc"]), msg, e["type"]))
        return
    except (InvalidInput, TooLarge) as exc:
        problems.extend(_relocated(exc, loc, f"row {row['id']!r}: "))
        return
    if "image" in row or "verifier" in row:
        problems.extend(_row_task_problems(loc, row, settings, context))


def _row_task_problems(
    loc: tuple[str | int, ...], row: Mapping[str, Any], settings: Settings, context: RowContext
) -> list[Problem]:
    """What the row's `image` and `verifier` make wrong in each arm's task (the arm's own
    problems are the arm's, reported once)."""
    tenant, own, arms = context
    found: dict[tuple[str, str], Problem] = {}
    for arm in arms:
        try:
            body = arm_submission(arm, row["problem_statement"], {}, {}, row)
            resolve_spec(body, settings, tenant=tenant, own=own)
        except ValidationError:
            continue  # the arm's own options: reported at the arm
        except InvalidInput as exc:
            for item in _relocated(exc, loc, f"row {row['id']!r}: "):
                part = item["loc"][len(loc) + 1 : len(loc) + 2]
                if part in (["sandbox"], ["verifier"]):
                    found.setdefault((str(item["loc"]), str(item["msg"])), item)
    return list(found.values())


def _relocated(
    exc: InvalidInput | TooLarge, under: tuple[str | int, ...], prefix: str = ""
) -> list[Problem]:
    """A submission's problems (loc ["body", ...]) moved under `under`, messages prefixed."""
    details = exc.details if isinstance(exc.details, list) else [problem((), exc.message)]
    return [
        {**p, "loc": ["body", *under, *p["loc"][1:]], "msg": prefix + str(p["msg"])}
        for p in details
    ]


def _slice(
    rows: list[dict[str, Any]], start: str | None, end: str | None, problems: list[Problem]
) -> list[dict[str, Any]]:
    ids = [row["id"] for row in rows]
    for name, value in (("start_id", start), ("end_id", end)):
        if value is not None and value not in ids:
            problems.append(problem((name,), f"no row with id {value!r} in the dataset"))
    if problems:
        return rows
    first = ids.index(start) if start is not None else 0
    last = ids.index(end) if end is not None else len(rows) - 1
    if first > last:
        problems.append(problem(("end_id",), f"row {end!r} comes before row {start!r}"))
    return rows[first : last + 1]


def _summary(problems: list[Problem]) -> str:
    head = "; ".join(f"{dotted(tuple(p['loc'][1:]))}: {p['msg']}" for p in problems[:5])
    return head + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
