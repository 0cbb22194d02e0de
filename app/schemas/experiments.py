"""The v1 wire models of experiments: what `POST /v1/experiments` takes and what reads return.

A leaf like `app.schemas.tasks`. A dataset row is a free JSON object (its extra fields go to the
scorer), so rows are checked by `services.experiments`, which can name the row and field.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field

from app.schemas.rollouts import GroupOut
from app.schemas.tasks import JsonObject, WireModel, _Strict, check_text
from app.specs import WebhookSpec

ArmMode = Literal["sandbox", "vanilla"]
ArmName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
ItemStatus = Literal["pending", "running", "scoring", "scored", "error", "cancelled"]
ErrorKind = Literal["agent", "infrastructure", "scorer"]
MAX_ROWS = 100_000
"""A hard ceiling on parsing; `Settings.experiment_max_rows` is the configurable limit."""


class ArmCreate(_Strict):
    """One way of running every row: a task's options, in a sandbox or as one model call."""

    name: ArmName
    """How results, items and comparisons name the arm."""
    mode: ArmMode = "sandbox"
    """`sandbox`: each item is an agent task; `vanilla`: one model call, no tools and no
    sandbox (the baseline)."""
    task: JsonObject = Field(default_factory=dict)
    """Everything a task takes (`TaskCreate`) except `prompt` and `input_files`."""
    prompt_field: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
    """A row field holding this arm's whole prompt instead of `problem_statement` (the
    package's `create_prompt(row)`, rendered by `sandhive experiment run`); a vanilla arm
    then sends it as it is, without embedding the row's input files again."""


class DatasetIn(_Strict):
    """The dataset, inline (larger ones: multipart/form-data with a `dataset` file)."""

    rows: list[JsonObject] = Field(min_length=1, max_length=MAX_ROWS)
    """Each row: `id`, `problem_statement`, optional `ground_truth`, `input_files`
    (object of path to text, or that object as a JSON string), `domain`, and any other
    fields the scorer reads."""


EXPERIMENT_EXAMPLES: dict[str, dict[str, Any]] = {
    "scripted": {
        "summary": "Sandbox against vanilla on the built-in scripted demo model",
        "description": "Needs `SANDHIVE_SCRIPTED_PROFILE=true` (`make run` sets it).",
        "value": {
            "name": "arith, sandbox vs vanilla",
            "dataset": {
                "rows": [
                    {"id": "q1", "problem_statement": "What is 17 * 23?", "ground_truth": "391"},
                    {
                        "id": "q2",
                        "problem_statement": "Sum the column x of data.csv.",
                        "ground_truth": "6",
                        "input_files": {"data.csv": "x\n1\n2\n3\n"},
                        "domain": "files",
                    },
                ]
            },
            "arms": [
                {
                    "name": "sandbox",
                    "task": {"llm": {"profile": "scripted"}, "limits": {"max_steps": 30}},
                },
                {"name": "vanilla", "mode": "vanilla", "task": {"llm": {"profile": "scripted"}}},
            ],
            "scorer": {"kind": "math"},
            "attempts": 2,
            "concurrency": 4,
            "metadata": {"owner": "me"},
        },
    },
}
"""Named examples of `POST /v1/experiments` (tests/api/test_openapi.py submits them)."""


class ExperimentWebhook(_Strict):
    """Where this experiment's own events go, besides the tenant's subscriptions."""

    url: Annotated[str, Field(max_length=2000), AfterValidator(check_text)]
    """The http(s) URL that receives the POSTs, checked like a subscription's."""
    events: list[Literal["experiment.finished"]] = Field(
        default=["experiment.finished"], min_length=1, max_length=1
    )
    """Which of the experiment's events to send there (`experiment.finished`)."""


ScoringRules = Literal["sandhive", "package"]


class ExperimentCreate(_Strict):
    """An evaluation run: every row x arm x attempt runs as a task and is scored as it ends."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [e["value"] for e in EXPERIMENT_EXAMPLES.values()]}
    )

    name: Annotated[str, Field(min_length=1, max_length=200), AfterValidator(check_text)]
    """A label for people."""
    dataset: DatasetIn
    """The rows."""
    arms: list[ArmCreate] = Field(min_length=1, max_length=64)
    """How each row is run (every row runs in every arm)."""
    scorer: JsonObject
    """How an answer is scored: `{"kind": ...}` with its options, a built-in (`math`,
    `mcq`, `exact`, `contains`, `regex`, `f1`, `rouge_l`, `instruction_following`),
    `python` or `llm_judge` (docs/experiments.md)."""
    attempts: int = Field(default=1, ge=1, le=1000)
    """Runs of each row in each arm (pass@k needs more than one)."""
    concurrency: int = Field(default=8, ge=1, le=100_000)
    """Items of this experiment running at once."""
    metadata: JsonObject = Field(default_factory=dict)
    """Any JSON object the caller wants back with the experiment."""
    start_id: str | None = Field(default=None, max_length=200)
    """With `end_id`: only the rows from this id to that one (inclusive, in dataset order)."""
    end_id: str | None = Field(default=None, max_length=200)
    """The last row to run, with `start_id` (inclusive)."""
    webhook: ExperimentWebhook | None = None
    """This experiment's own webhook, signed with the secret of the tenant's newest
    subscription (so the tenant needs one: `POST /v1/webhooks`)."""
    infrastructure_retries: int = Field(default=1, ge=0, le=5)
    """Times an item whose task the service failed (`sandbox_error`, `llm_error`,
    `worker_lost`) runs again as a new task before it ends not scored."""
    rules: ScoringRules = "sandhive"
    """How an item's end becomes a score. `sandhive`: a submitted answer is scored as it
    is, and an agent that gave none (or ran out of steps, context or time) is an `agent`
    error. `package`: as `llm-in-sandbox benchmark` scores: a sandbox arm's answer as the
    package reads it (`answer.txt` stripped of surrounding whitespace, ANSI colour codes
    and carriage returns), and an end of the agent's own doing scored on whatever answer
    it left, the empty text if none (so usually 0, not an error). `sandhive experiment run
    FOLDER` uses `package` (docs/experiments.md)."""


class RegradeIn(_Strict):
    """Score every answered item again with another scorer."""

    scorer: JsonObject
    """Any scorer `POST /v1/experiments` takes, checked the same way."""


class ArmOut(WireModel):
    """An arm, as submitted."""

    name: str
    """The arm's name."""
    mode: ArmMode
    """`sandbox` or `vanilla`."""
    profile: str | None = None
    """The LLM profile its tasks resolved to when the experiment was created (`scripted`:
    the built-in fixed script, whose numbers say nothing about a model); null for
    experiments created before it was recorded."""


class ArmProgress(WireModel):
    """How many of an arm's items are in each status."""

    pending: int = 0
    """Not started yet."""
    running: int = 0
    """Running as tasks."""
    scoring: int = 0
    """Answered, waiting for (or in) a slow scorer (`llm_judge`, `python`)."""
    scored: int = 0
    """Scored."""
    error: int = 0
    """Ended in an error (an agent, infrastructure or scorer error)."""
    not_scored: int = 0
    """Of `error`, those the service or the scorer failed (infrastructure or scorer errors):
    they have no score at all, where an agent error scores 0 (`coverage` of the results).
    A part of `error`, not a status of its own: the statuses add up to the items without it."""
    cancelled: int = 0
    """Cancelled before they ended."""


class ExperimentOut(WireModel):
    """An experiment and its progress."""

    id: str
    """`exp_` and a ULID."""
    name: str
    """As submitted."""
    status: Literal["running", "finished", "cancelled"]
    """`running` until every item has ended (then `finished`), or `cancelled`."""
    created_at: datetime
    """When it was submitted."""
    finished_at: datetime | None
    """When it finished or was cancelled; null while running."""
    arms: list[ArmOut]
    """Its arms, in submitted order."""
    scorer: dict[str, Any]
    """The current scorer (the latest regrade's, else the original)."""
    grading: int = 1
    """Which scoring the items show: 1 is the original, each regrade adds one."""
    attempts: int
    """Runs of each row in each arm."""
    concurrency: int
    """Items running at once, at most."""
    rows: int
    """Dataset rows it runs (after `start_id` / `end_id`)."""
    metadata: dict[str, Any]
    """As submitted."""
    progress: dict[str, ArmProgress]
    """Per arm, how many items are in each status."""
    webhook: WebhookSpec | None = None
    """The experiment's own webhook (`signed_by`: the subscription whose secret signs it);
    null without one."""
    rules: ScoringRules = "sandhive"
    """How an item's end becomes a score (`ExperimentCreate.rules`)."""
    infrastructure_retries: int = 0
    """Runs again of an item the service failed (`ExperimentCreate.infrastructure_retries`;
    0 for experiments created before there were any)."""


class ItemOut(WireModel):
    """One row in one arm, one attempt: its task and its score."""

    row_id: str
    """The dataset row's `id`."""
    arm: str
    """The arm's name."""
    attempt: int
    """From 1."""
    status: ItemStatus
    """`pending`, `running`, `scoring` (answered, waiting for a slow scorer), `scored`,
    `error` or `cancelled`."""
    score: float | None
    """The scorer's score (a pass is 1); null until scored."""
    error_kind: ErrorKind | None
    """Whose failure an `error` is: `agent` (no usable answer), `infrastructure` (the task
    could not run) or `scorer`; null otherwise."""
    answer: str | None
    """The task's answer; null without one. Under `rules: package`, the text scored: the
    answer as the package reads it, or the empty text."""
    task_id: str | None
    """The task that ran it; null before it started."""
    prompt_tokens: int
    """Prompt tokens of its task."""
    completion_tokens: int
    """Completion tokens of its task."""
    steps: int
    """Steps of its task."""
    seconds: float
    """Wall time of its task, start to finish."""
    detail: dict[str, Any]
    """What the scorer reports (what it extracted and compared, a judge's exchange,
    an error's reason)."""
    retries: int = 0
    """Times it ran again as a new task after the service failed its task (`task_id` is
    the last one's; the experiment's events name the earlier ones)."""
    gradings: list[dict[str, Any]] = Field(default_factory=list)
    """Earlier scorings of this item, oldest first (one per regrade):
    `{grading, scorer, status, score, error_kind, detail}`."""


class ItemList(WireModel):
    """An experiment's items."""

    items: list[ItemOut]
    """The items (filtered as the query asked)."""


ArmIntervalMethod = Literal["wilson", "bootstrap"]
"""How an arm's interval was computed (docs/experiments.md, "Which estimator is which")."""
PairIntervalMethod = Literal["bootstrap", "hoeffding"]
"""How a paired difference's interval was computed (the same table)."""


class IntervalOut(WireModel):
    """A 95% confidence interval."""

    low: float
    """Its lower bound."""
    high: float
    """Its upper bound."""


class Spread(WireModel):
    """A cost over an arm's items that ran."""

    median: float
    """Per item, the median."""
    total: float
    """Over all of them, the sum."""


class DomainResult(WireModel):
    """An arm's score on the rows of one `domain`."""

    n: int
    """Scored items of the domain (every attempt counts)."""
    rows: int = 0
    """Its rows with a scored item: what `mean` and `ci95` are over."""
    mean: float
    """Their mean score (each row's mean over its scored attempts, then over rows)."""
    ci95: IntervalOut
    """95% interval of that mean, over rows (as the arm's `ci95`)."""


class Coverage(WireModel):
    """What an arm's numbers stand on: its items by whether they have a score. `items` is
    the sum of the other five."""

    items: int = 0
    """The arm's items (rows x attempts)."""
    scored: int = 0
    """Items with a score: what `mean`, `ci95` and the pairs are computed from."""
    agent_errors: int = 0
    """Items the model failed without a score (no answer, out of steps, context or time;
    under `rules: package` these are scored instead)."""
    not_scored: int = 0
    """Items that ended without a score through no fault of the model: the service failed
    (infrastructure, after the experiment's `infrastructure_retries`) or the scorer could
    not judge. Left out of every number, never a 0; `errors` says which."""
    unfinished: int = 0
    """Items still pending, running or being scored."""
    cancelled: int = 0
    """Items cancelled."""
    retried: int = 0
    """Items run again after an infrastructure failure (counted once however many times)."""


class ArmResult(WireModel):
    """One arm's score and costs."""

    arm: str
    """The arm's name."""
    n: int
    """Scored items (every attempt counts)."""
    rows: int = 0
    """Rows with at least one scored attempt: the `n` that `mean` and `ci95` are over."""
    mean: float | None
    """mean@k: each row's mean over its scored attempts, then the mean over rows (the plain
    mean of the scored items with one attempt); null when no item is scored."""
    ci95: IntervalOut | None
    """95% interval of `mean`, over rows (a row's attempts are one cluster, not independent
    draws): Wilson when every row's mean is 0 or 1, else a percentile bootstrap of rows."""
    ci95_method: ArmIntervalMethod | None = None
    """Which of the two `ci95` is: `wilson` or `bootstrap`."""
    pass_at_k: dict[str, float] | None
    """Unbiased pass@k for k = 1..attempts, over rows whose every attempt was scored
    (a pass is a score of 1); None with one attempt."""
    errors: dict[str, int]
    """Items in error, by kind (`agent`, `infrastructure`, `scorer`)."""
    cancelled: int
    """Cancelled items."""
    prompt_tokens: Spread
    """Prompt tokens of the items' tasks."""
    completion_tokens: Spread
    """Completion tokens of the items' tasks."""
    steps: Spread
    """Steps of the items' tasks."""
    seconds: Spread
    """Wall time of the items' tasks, start to finish."""
    domains: dict[str, DomainResult]
    """The same score per row `domain` (rows without one are left out)."""
    coverage: Coverage = Field(default_factory=Coverage)
    """How many of the arm's items the numbers stand on, and why the others have none."""


class PairOut(WireModel):
    """Arm `a` against arm `b`, row by row."""

    a: str
    """One arm."""
    b: str
    """The arm it is compared with."""
    n: int
    """Rows scored in both arms (a row's score: the mean over its scored attempts)."""
    mean_a: float
    """Arm a's mean over those rows."""
    mean_b: float
    """Arm b's mean over those rows."""
    difference: float
    """The mean of a's score minus b's, per row."""
    ci95: IntervalOut
    """95% interval of `difference`: a paired bootstrap over rows from 20 rows whose
    differences vary, else Hoeffding's (wide, but right at any n): see `ci95_method`."""
    ci95_method: PairIntervalMethod = "bootstrap"
    """`bootstrap` or `hoeffding`."""
    wins: int
    """Rows where a scored higher than b (by more than 1e-9)."""
    ties: int
    """Rows where they scored the same (within 1e-9: float noise is no win)."""
    losses: int
    """Rows where a scored lower than b."""
    p_value: float = 1.0
    """Exact two-sided sign test of wins against losses (ties left out)."""
    verdict: Literal["a_higher", "b_higher", "no_clear_difference", "too_few_pairs"] = (
        "no_clear_difference"
    )
    """`too_few_pairs` below 8 rows with a winner (no clear difference can be shown there);
    `a_higher` / `b_higher` only when p < 0.05 and the interval lies on that side of 0."""
    summary: str = ""
    """The verdict in words for this run: "sandbox higher by 0.170 [0.030, 0.310] on 40
    rows", "cannot tell sandbox and vanilla apart on 6 rows", "too few rows with a
    winner (5; 8 needed) to tell sandbox and vanilla apart"."""


class ResultsOut(WireModel):
    """An experiment's results so far: per arm, and per pair of arms."""

    experiment_id: str
    """The experiment."""
    status: str
    """The experiment's status (results of a running one are partial)."""
    grading: int = 1
    """The scoring these results are of (`?grading=N`; the current one by default)."""
    arms: list[ArmResult]
    """Per arm, in submitted order."""
    pairs: list[PairOut]
    """For every pair of arms."""
    groups: list[GroupOut] = Field(default_factory=list)
    """GRPO groups (RL, docs/rl.md): per row and arm, the reward mean and std over the
    attempts and each rollout's advantage; in item order."""


class ExperimentList(WireModel):
    """A page of the tenant's experiments."""

    experiments: list[ExperimentOut]
    """Newest first."""
    next_cursor: str | None
    """Pass back as `cursor` for the next page; None on the last one."""


class ExperimentEventOut(WireModel):
    """One event of an experiment's stream (SSE or WebSocket)."""

    seq: int | None
    """From 1 per experiment, no gaps; None only on a live-only `keepalive`."""
    type: str
    """`item.started`, `item.ended`, `item.retried`, `item.scored`, `experiment.regrading`,
    `experiment.finished`, `experiment.cancelled`; live-only `keepalive`."""
    ts: datetime
    """When it happened."""
    data: dict[str, Any]
    """The event's own fields (docs/experiments.md)."""


class PackageConfig(WireModel):
    """The package's `results.json` `config`; None where Sandhive has no such setting."""

    mode: Literal["llm-in-sandbox", "llm"]
    """`llm-in-sandbox` for a sandbox arm, `llm` for a vanilla one."""
    docker_image: str | None
    """The sandbox image; null for a vanilla arm."""
    llm_name: str | None
    """The model."""
    llm_base_url: str | None
    """Always null: the operator's endpoint is not shown to tenants."""
    max_steps: int | None
    """`limits.max_steps`; null for a vanilla arm."""
    temperature: float | None
    """`llm.temperature`."""
    max_token_limit: int | None
    """`limits.max_context_tokens`; null for a vanilla arm."""
    max_tokens_per_call: int | None
    """`llm.max_tokens_per_call`."""
    max_response_len: int | None
    """A vanilla arm's `llm.max_tokens_per_call`; null for a sandbox arm."""
    extra_body: dict[str, Any] | None
    """`llm.extra_body`."""
    save_litellm_response: bool | None
    """Always false: Sandhive stores the trajectory instead."""


class PackageArm(WireModel):
    """One arm as the package's `llm-in-sandbox benchmark` writes its `results.json`."""

    config: PackageConfig
    """The arm's run settings."""
    task: str
    """The experiment's name."""
    total: int
    """Items that ended."""
    mean_score: float
    """Over `total`, an error counting as 0 (the package's rule)."""
    num_errors: int
    """Items that ended in error."""
    elapsed_time_seconds: float
    """From the experiment's creation to its end (or now)."""


class PackageResults(WireModel):
    """`?format=package`: each arm's `results.json`."""

    arms: dict[str, PackageArm]
    """By arm name."""
