"""The v1 wire models of experiments: what `POST /v1/experiments` takes and what reads return.

A leaf like `app.schemas`. A dataset row is a free JSON object (its extra fields go to the
scorer), so rows are checked by `services.experiments`, which can name the row and field.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from app.schemas import JsonObject, check_text

ArmMode = Literal["sandbox", "vanilla"]
ArmName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
ItemStatus = Literal["pending", "running", "scored", "error", "cancelled"]
ErrorKind = Literal["agent", "infrastructure", "scorer"]
MAX_ROWS = 100_000
"""A hard ceiling on parsing; `Settings.experiment_max_rows` is the configurable limit."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ArmCreate(_Strict):
    name: ArmName
    mode: ArmMode = "sandbox"
    task: JsonObject = Field(default_factory=dict)
    """Everything a task takes (`TaskCreate`) except `prompt` and `input_files`."""


class DatasetIn(_Strict):
    rows: list[JsonObject] = Field(min_length=1, max_length=MAX_ROWS)
    """Each row: `id`, `problem_statement`, optional `ground_truth`, `input_files`
    (object of path to text, or that object as a JSON string), `domain`, and any other
    fields the scorer reads."""


class ExperimentCreate(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=200), AfterValidator(check_text)]
    dataset: DatasetIn
    arms: list[ArmCreate] = Field(min_length=1, max_length=64)
    scorer: JsonObject
    attempts: int = Field(default=1, ge=1, le=1000)
    concurrency: int = Field(default=8, ge=1, le=100_000)
    metadata: JsonObject = Field(default_factory=dict)
    start_id: str | None = Field(default=None, max_length=200)
    """With `end_id`: only the rows from this id to that one (inclusive, in dataset order)."""
    end_id: str | None = Field(default=None, max_length=200)


class ArmOut(BaseModel):
    name: str
    mode: ArmMode


class ArmProgress(BaseModel):
    pending: int = 0
    running: int = 0
    scored: int = 0
    error: int = 0
    cancelled: int = 0


class ExperimentOut(BaseModel):
    id: str
    name: str
    status: Literal["running", "finished", "cancelled"]
    created_at: datetime
    finished_at: datetime | None
    arms: list[ArmOut]
    scorer: dict[str, Any]
    attempts: int
    concurrency: int
    rows: int
    metadata: dict[str, Any]
    progress: dict[str, ArmProgress]
    """Per arm, how many items are in each status."""


class ItemOut(BaseModel):
    row_id: str
    arm: str
    attempt: int
    status: ItemStatus
    score: float | None
    error_kind: ErrorKind | None
    answer: str | None
    task_id: str | None
    prompt_tokens: int
    completion_tokens: int
    steps: int
    seconds: float
    detail: dict[str, Any]


class ItemList(BaseModel):
    items: list[ItemOut]


class IntervalOut(BaseModel):
    low: float
    high: float


class Spread(BaseModel):
    median: float
    total: float


class DomainResult(BaseModel):
    n: int
    mean: float
    ci95: IntervalOut


class ArmResult(BaseModel):
    arm: str
    n: int
    """Scored items (every attempt counts)."""
    mean: float | None
    ci95: IntervalOut | None
    """Wilson interval when every score is 0 or 1, else a percentile bootstrap."""
    pass_at_k: dict[str, float] | None
    """Unbiased pass@k for k = 1..attempts, over rows whose every attempt was scored
    (a pass is a score of 1); None with one attempt."""
    errors: dict[str, int]
    cancelled: int
    prompt_tokens: Spread
    completion_tokens: Spread
    steps: Spread
    seconds: Spread
    """Wall time of the items' tasks, start to finish."""
    domains: dict[str, DomainResult]


class PairOut(BaseModel):
    a: str
    b: str
    n: int
    """Rows scored in both arms (a row's score: the mean over its scored attempts)."""
    mean_a: float
    mean_b: float
    difference: float
    ci95: IntervalOut
    """Paired bootstrap over rows."""
    wins: int
    ties: int
    losses: int


class ResultsOut(BaseModel):
    experiment_id: str
    status: str
    arms: list[ArmResult]
    pairs: list[PairOut]
