"""An experiment's results in the reference package's `results.json` shape, one per arm, for
people who compare Sandhive's numbers with `llm-in-sandbox benchmark`'s.

The package counts every problem that ran and scores an error as 0, so `mean_score` here
does too (unlike `/results`' `mean`, which is over scored items with errors apart): the
two are then comparable. The `config` is what the arm's tasks ran with (the spec stored on
its first task), with None where Sandhive has no such setting and no secret in it.
`?grading=N` reads an earlier scoring from the items' archive, as `/results` does. Imported
by the API.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import distinct_on

from app.config import Settings
from app.db import models
from app.db.engine import Sessions
from app.domain.resolve import problem, resolve_spec
from app.errors import InvalidInput
from app.ids import utc_now
from app.schemas.experiments import PackageArm, PackageConfig, PackageResults
from app.services.experiments.input import PLACEHOLDER_PROMPT, arm_submission
from app.services.experiments.scoring import grading_of
from app.services.experiments.service import find_experiment
from app.specs import TaskSpec, read_spec

Item = models.ExperimentItem
ENDED = ("scored", "error")
"""Items with an outcome: the package's `total` (cancelled and unstarted items never ran)."""
PACKAGE_MODES = {"sandbox": "llm-in-sandbox", "vanilla": "llm"}


async def get_package_results(
    sessions: Sessions,
    settings: Settings,
    tenant: str,
    experiment_id: str,
    grading: int | None = None,
) -> PackageResults:
    """The current scoring's numbers, or an earlier one's (`grading`, from 1)."""
    async with sessions() as session:
        exp = await find_experiment(session, tenant, experiment_id)
        current = grading_of(exp.spec)
        if grading is not None and not 1 <= grading <= current:
            msg = f"experiment {exp.id} has gradings 1 to {current}, not {grading}"
            raise InvalidInput(msg, details=[problem(("grading",), msg, "not_found")])
        chosen = current if grading is None else grading
        items = await session.execute(
            select(Item.arm, Item.status, Item.score, Item.gradings).where(
                Item.experiment_id == exp.id
            )
        )
        outcomes = [
            (arm, *_outcome(status, score, gradings, chosen, current))
            for arm, status, score, gradings in items
        ]
        first_specs = await session.execute(
            select(Item.arm, models.Task.spec)
            .join(models.Task, models.Task.id == Item.task_id)
            .where(Item.experiment_id == exp.id)
            .order_by(Item.arm, Item.seq)
            .ext(distinct_on(Item.arm))
        )
        specs = {arm: read_spec(spec) for arm, spec in first_specs}
    elapsed = ((exp.finished_at or utc_now()) - exp.created_at).total_seconds()
    arms: dict[str, PackageArm] = {}
    for arm in exp.spec["arms"]:
        ended = [
            (status, score)
            for name, status, score in outcomes
            if name == arm["name"] and status in ENDED
        ]
        errors = sum(status == "error" for status, _ in ended)
        total = sum(score or 0.0 for status, score in ended if status == "scored")
        spec = specs.get(arm["name"]) or _resolved(arm, settings)
        arms[arm["name"]] = PackageArm(
            config=package_config(arm["mode"], spec, settings),
            task=exp.name,
            total=len(ended),
            mean_score=total / len(ended) if ended else 0.0,
            num_errors=errors,
            elapsed_time_seconds=round(elapsed, 3),
        )
    return PackageResults(arms=arms)


def _outcome(
    status: str, score: float | None, gradings: list[dict[str, Any]], chosen: int, current: int
) -> tuple[str, float | None]:
    """An item's status and score in grading `chosen` (its archive, as `/results` reads it)."""
    if chosen == current:
        return status, score
    found = next((g for g in gradings if g.get("grading") == chosen), None)
    if found is None:  # archived by every regrade; one without it is as it was then
        return status, score
    return str(found.get("status")), found.get("score")


def _resolved(arm: Mapping[str, Any], settings: Settings) -> TaskSpec | None:
    """An arm none of whose tasks was created yet: its options as a task would resolve now."""
    try:
        return resolve_spec(arm_submission(arm, PLACEHOLDER_PROMPT, {}, {}), settings)
    except (InvalidInput, ValueError):  # the server's limits changed since it was accepted
        return None


def package_config(mode: str, spec: TaskSpec | None, settings: Settings) -> PackageConfig:
    """The package's run settings that have a Sandhive counterpart; None for the rest."""
    sandbox = mode == "sandbox"
    if spec is None:
        return PackageConfig.model_validate(
            {"mode": PACKAGE_MODES[mode]} | dict.fromkeys(_NULLABLE)
        )
    return PackageConfig(
        mode=PACKAGE_MODES[mode],
        docker_image=spec.sandbox.image if sandbox else None,
        llm_name=spec.llm.model,
        # An arm's own rollout server is the tenant's (it named it); the profile's
        # endpoint is the operator's, not a tenant's to see.
        llm_base_url=spec.llm.base_url,
        max_steps=spec.limits.max_steps if sandbox else None,
        temperature=spec.llm.temperature,
        max_token_limit=spec.limits.max_context_tokens if sandbox else None,
        max_tokens_per_call=spec.llm.max_tokens_per_call,
        max_response_len=None if sandbox else spec.llm.max_tokens_per_call,
        extra_body=dict(spec.llm.extra_body),
        save_litellm_response=False,
    )


_NULLABLE = tuple(name for name in PackageConfig.model_fields if name != "mode")
