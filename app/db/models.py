"""ORM tables (SQLAlchemy 2, `Mapped[]`). Schema changes go through Alembic only."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from app.ids import utc_now


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "pk": "pk_%(table_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s",
            "ix": "ix_%(table_name)s_%(column_0_name)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
        }
    )


_TZ = DateTime(timezone=True)


class Task(Base):
    __tablename__ = "tasks"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_tasks_tenant_idempotency"),
        Index("ix_tasks_tenant_created", "tenant_id", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), index=True)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    prompt: Mapped[str] = mapped_column(Text)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)
    """The resolved `specs.TaskSpec`, as `specs.stored` writes it."""
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB, default=dict)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    lost_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Attempts whose worker died; at `worker_max_attempts` the task fails `worker_lost`."""
    cancel_requested_at: Mapped[datetime | None] = mapped_column(_TZ)
    """Set by a cancel of a running task; the worker running it then stops it."""
    answer: Mapped[str | None] = mapped_column(Text)
    usage: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    artifacts_skipped: Mapped[list[dict[str, str]]] = mapped_column(
        JSONB, default=list, server_default=text("'[]'::jsonb")
    )
    """Output files left out of the artifacts (caps, symlinks, special files): {path, reason}."""
    error: Mapped[str | None] = mapped_column(Text)
    verification: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    """What the task's verifier found (`VerificationOut`); null without one or before it ran."""
    parent_id: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    """The task a fork was made from (`spec.fork.task_id`), for `?forked_from=`."""
    diverged: Mapped[dict[str, Any] | None] = mapped_column(JSONB, nullable=True)
    """A fork by replay allowed to diverge: the first step that answered otherwise than
    its parent's (`step`, `expected`, `got`); None for every other task."""
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    idempotency_fingerprint: Mapped[str | None] = mapped_column(String(64))
    """sha256 of what a keyed task was submitted with (`services.idempotency`); null on rows
    stored before it was kept, and on tasks without a key."""
    last_seq: Mapped[int] = mapped_column(Integer, default=0)
    """Highest durable event seq; bumped under the row lock so seqs have no gaps."""
    created_at: Mapped[datetime] = mapped_column(_TZ, default=utc_now)
    started_at: Mapped[datetime | None] = mapped_column(_TZ)
    finished_at: Mapped[datetime | None] = mapped_column(_TZ)


class InputBlob(Base):
    """A file the caller sent with the task; copied to /testbed/input/<path>."""

    __tablename__ = "task_inputs"

    task_id: Mapped[str] = mapped_column(
        ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True
    )
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    content: Mapped[bytes] = mapped_column(LargeBinary)


class Step(Base):
    __tablename__ = "steps"

    task_id: Mapped[str] = mapped_column(
        ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True
    )
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    thought: Mapped[str] = mapped_column(Text, default="")
    reasoning: Mapped[str] = mapped_column(Text, default="")
    action: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    observation: Mapped[str] = mapped_column(Text, default="")
    exit_code: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(_TZ)
    llm_ms: Mapped[int] = mapped_column(Integer, default=0)
    tool_ms: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    interrupted: Mapped[str | None] = mapped_column(String(32))
    """Why the step was cut short (`schemas.StepOut.interrupted`); None when it ran to its end."""
    capture_json: Mapped[dict[str, Any] | None] = mapped_column(JSON, deferred=True)
    """With `llm.capture`: the call's new request messages, answer, token ids and logprobs,
    stored as a delta to the step before (`app.domain.rollout_capture`); None otherwise.
    `json`, not `jsonb`: Postgres keeps its text as written, so the messages and tools come
    back with their keys in the order they were sent (a chat template renders the tools'
    JSON into the prompt; `jsonb` sorts keys, and the re-rendered prompt was another).
    Deferred: trajectory reads never load it."""
    message: Mapped[dict[str, Any] | None] = mapped_column(JSON, deferred=True)
    """The step's assistant message exactly as the history sent it back (`json`: its keys
    in order), which a fork by replay plays again; None in rows stored before it was kept."""
    capture: Mapped[dict[str, Any] | None] = mapped_column(JSONB, deferred=True)
    """The same, as releases before `capture_json` stored it (keys reordered); read only
    for their rows."""


class Event(Base):
    """A durable event; `seq` counts from 1 per task with no gaps (invariant 3)."""

    __tablename__ = "events"

    task_id: Mapped[str] = mapped_column(
        ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    type: Mapped[str] = mapped_column(String(32))
    ts: Mapped[datetime] = mapped_column(_TZ, default=utc_now)
    data: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)


class Artifact(Base):
    __tablename__ = "artifacts"

    task_id: Mapped[str] = mapped_column(
        ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True
    )
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    content_type: Mapped[str] = mapped_column(String(200))
    sha256: Mapped[str] = mapped_column(String(64))
    content: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(_TZ, default=utc_now)


class ApiKey(Base):
    """An API key of one tenant. Only its SHA-256 is stored; the key is shown once at creation."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    """`key_<16 hex>`, also embedded in the key itself so a lookup needs no hash index."""
    tenant_id: Mapped[str] = mapped_column(String(64), index=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    key_sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(_TZ, default=utc_now)
    revoked_at: Mapped[datetime | None] = mapped_column(_TZ)


class Experiment(Base):
    """An evaluation run: a dataset's rows x arms x attempts, each item run as a task."""

    __tablename__ = "experiments"
    __table_args__ = (Index("ix_experiments_tenant_created", "tenant_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), index=True)
    """`running`, `finished` or `cancelled`."""
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)
    """Arms (name, mode, task options), scorer spec, attempts, concurrency."""
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB, default=dict)
    created_at: Mapped[datetime] = mapped_column(_TZ, default=utc_now)
    finished_at: Mapped[datetime | None] = mapped_column(_TZ)
    event_seq: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """The last `seq` of its `experiment_events`; bumped under the experiment's row lock."""


class ExperimentItem(Base):
    """One row x arm x attempt of an experiment: at most one task, scored at most once."""

    __tablename__ = "experiment_items"
    __table_args__ = (
        Index("ix_experiment_items_experiment_status", "experiment_id", "status"),
        Index("ix_experiment_items_experiment_seq", "experiment_id", "seq"),
    )

    experiment_id: Mapped[str] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    row_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    arm: Mapped[str] = mapped_column(String(64), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer)
    """Start order: attempt, then row, then arm."""
    own_row: Mapped[dict[str, Any] | None] = mapped_column("row", JSONB, deferred=True)
    """The row as releases before `experiment_rows` stored it, a copy per item; NULL for
    items created since. Read through `app.services.experiments.rows`, never directly; a
    later release moves what is left into `experiment_rows` and drops the column (the
    expand-then-contract rule of docs/operations.md)."""
    task_id: Mapped[str | None] = mapped_column(String(40), unique=True)
    """No foreign key: pruning old tasks must not take an experiment's results with it."""
    status: Mapped[str] = mapped_column(String(16))
    """`pending`, `running`, `scoring`, `scored`, `error` or `cancelled`."""
    score: Mapped[float | None] = mapped_column(Float)
    error_kind: Mapped[str | None] = mapped_column(String(16))
    """`agent`, `infrastructure` or `scorer` when `status` is `error`."""
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    answer: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    steps: Mapped[int] = mapped_column(Integer, default=0)
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[datetime] = mapped_column(_TZ, default=utc_now)
    scoring_until: Mapped[datetime | None] = mapped_column(_TZ)
    """While `scoring`: the lease of the worker scoring it (None: anyone may take it)."""
    scoring_claims: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    """Scoring leases taken on the item's current scoring: past the limit it is a scorer
    error, so a scorer that kills its worker (or never writes) cannot loop forever."""
    gradings: Mapped[list[dict[str, Any]]] = mapped_column(
        JSONB, default=list, server_default=text("'[]'::jsonb")
    )
    """Earlier scorings, oldest first: `{grading, scorer, status, score, error_kind, detail}`."""
    retries: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    """Times the item went back to `pending` after the service failed its task."""


class ExperimentRow(Base):
    """A dataset row of an experiment, stored once however many arms and attempts run it
    (a long-context row's documents weigh megabytes)."""

    __tablename__ = "experiment_rows"

    experiment_id: Mapped[str] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    row_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    row: Mapped[dict[str, Any]] = mapped_column(JSONB)


class ExperimentEvent(Base):
    """A durable experiment event; `seq` counts from 1 per experiment with no gaps."""

    __tablename__ = "experiment_events"

    experiment_id: Mapped[str] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    type: Mapped[str] = mapped_column(String(32))
    ts: Mapped[datetime] = mapped_column(_TZ, default=utc_now)
    data: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)


UNSCORED = (
    "reward IS NULL AND finish_reason = 'submitted' "
    "AND (scorer ->> 'kind') IN ('llm_judge', 'python')"
)
"""A submitted answer of a deferred scorer (`services.episodes.DEFERRED_KINDS`) with no
reward yet: `ix_episodes_unscored`'s predicate, queried as written (literals, so the
planner matches the partial index whatever the plan)."""


class EpisodeRow(Base):
    """An RL episode a trainer drives step by step; its sandbox lives on `worker`."""

    __tablename__ = "episodes"
    __table_args__ = (
        Index("ix_episodes_tenant_status", "tenant_id", "status"),
        Index("ix_episodes_worker_status", "worker", "status"),
        # The sweep's look for submitted answers a deferred scorer never scored: tiny (a
        # row leaves it once its reward is stored).
        Index("ix_episodes_unscored", "worker", postgresql_where=text(UNSCORED)),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    """`opening` (no worker yet), `open`, `done` (the loop ended) or `closed`."""
    worker: Mapped[str | None] = mapped_column(String(200))
    prompt: Mapped[str] = mapped_column(Text)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)
    """The resolved `specs.TaskSpec` (its LLM part unused: the trainer is the model)."""
    scorer: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    ground_truth: Mapped[Any] = mapped_column(JSONB, nullable=True)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text)
    error_kind: Mapped[str | None] = mapped_column(String(16))
    """`infrastructure` when the service, not the trainer's model, ended it badly."""
    answer: Mapped[str | None] = mapped_column(Text)
    steps: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    reward: Mapped[dict[str, Any] | None] = mapped_column(JSONB, nullable=True)
    """A deferred scorer's result (`llm_judge`, `python`), written once by the worker that
    held the episode (`services.episodes_reward.stored`); None for a built-in scorer,
    which the reward route runs itself, and while the worker still scores."""
    trajectory: Mapped[list[dict[str, Any]] | None] = mapped_column(
        JSONB, nullable=True, deferred=True
    )
    """Its steps (thought, tool call, observation, timings), written once as it ends, so
    a step of an open episode writes nothing more; None while open, and for an episode
    whose worker was lost. Deferred: only the trajectory read loads it."""
    parent_id: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    """A fork's parent episode (`POST /v1/episodes/{id}/fork`)."""
    fork_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """The step a fork's child went on from: the parent had taken this many."""
    created_at: Mapped[datetime] = mapped_column(_TZ, default=utc_now)
    updated_at: Mapped[datetime] = mapped_column(_TZ, default=utc_now)
    ended_at: Mapped[datetime | None] = mapped_column(_TZ)


class SandboxRow(Base):
    """A sandbox a caller drives itself (`/v1/sandboxes`): no agent loop, its container on
    `worker` until `expires_at`, deleted, or its worker is lost."""

    __tablename__ = "sandboxes"
    __table_args__ = (
        Index("ix_sandboxes_tenant_created", "tenant_id", "created_at"),
        # The upkeep's and the sweep's look for active sandboxes: tiny, whatever the history.
        Index(
            "ix_sandboxes_active",
            "worker",
            postgresql_where=text("status IN ('starting', 'running')"),
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    """`starting` (asked of a worker), `running` or `ended`."""
    worker: Mapped[str | None] = mapped_column(String(200))
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)
    """What was asked: image, limits, network, env (`schemas.sandboxes.SandboxCreate`)."""
    sandbox_metadata: Mapped[dict[str, str]] = mapped_column("metadata", JSONB)
    end_reason: Mapped[str | None] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text)
    commands: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    created_at: Mapped[datetime] = mapped_column(_TZ, default=utc_now)
    expires_at: Mapped[datetime] = mapped_column(_TZ)
    ended_at: Mapped[datetime | None] = mapped_column(_TZ)


class SandboxCommandRow(Base):
    """One command run in a sandbox through the API: who ran what, how it ended (the audit
    log). Written as it is sent, its outcome added as it ends; its output is the caller's,
    not kept."""

    __tablename__ = "sandbox_commands"
    __table_args__ = (Index("ix_sandbox_commands_sandbox_seq", "sandbox_id", "seq", unique=True),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    sandbox_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("sandboxes.id", ondelete="CASCADE")
    )
    seq: Mapped[int] = mapped_column(Integer)
    key_id: Mapped[str | None] = mapped_column(String(64))
    argv: Mapped[list[str] | None] = mapped_column(JSONB)
    command: Mapped[str | None] = mapped_column(Text)
    user: Mapped[str | None] = mapped_column(String(64))
    cwd: Mapped[str | None] = mapped_column(Text)
    truncated: Mapped[bool] = mapped_column(Boolean, default=False)
    """`argv`/`command` keep only their first characters (a command may be a megabyte)."""
    exit_code: Mapped[int | None] = mapped_column(Integer)
    timed_out: Mapped[bool] = mapped_column(Boolean, default=False)
    duration_ms: Mapped[int | None] = mapped_column(Integer)
    """None until it ends, and for good when its answer never came."""
    started_at: Mapped[datetime] = mapped_column(_TZ)


class WebhookSubscription(Base):
    """A tenant's webhook endpoint: which events it wants, and the secret that signs them.

    The secret is stored as given out: HMAC signing needs the secret itself (a hash of it
    could not sign). It is never returned again after creation or rotation.
    """

    __tablename__ = "webhook_subscriptions"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), index=True)
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSONB)
    secret: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(_TZ, default=utc_now)
    rotated_at: Mapped[datetime | None] = mapped_column(_TZ)
    previous_secret: Mapped[str | None] = mapped_column(String(100))
    """The secret the last rotation replaced, while it still signs beside the new one."""
    previous_until: Mapped[datetime | None] = mapped_column(_TZ)
    """Until when `previous_secret` signs too (a rotation's `overlap_s`); None: it does not."""


class WebhookDelivery(Base):
    """The outbox: one event for one subscription, written in the transaction of the change.

    `body` is the exact JSON sent (the same bytes on every retry); `log` has one entry per
    attempt. No foreign keys: the log outlives a deleted subscription or a pruned task.
    """

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(40), index=True)
    """Stable across retries and subscriptions: what a receiver de-duplicates on."""
    event_type: Mapped[str] = mapped_column(String(32))
    tenant_id: Mapped[str] = mapped_column(String(64))
    subscription_id: Mapped[str] = mapped_column(String(40), index=True)
    url: Mapped[str] = mapped_column(Text)
    task_id: Mapped[str | None] = mapped_column(String(40), index=True)
    experiment_id: Mapped[str | None] = mapped_column(String(40), index=True)
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    """`pending`, `delivered`, `failed` (gave up) or `dropped` (its subscription is gone)."""
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    log: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, default=list)
    """`{attempt, at, status_code, error, next_retry_at}` per attempt, oldest first."""
    next_attempt_at: Mapped[datetime] = mapped_column(_TZ)
    lease_until: Mapped[datetime | None] = mapped_column(_TZ)
    """While a sender holds it; a sender that died leaves it to others once past."""
    created_at: Mapped[datetime] = mapped_column(_TZ, default=utc_now)
    delivered_at: Mapped[datetime | None] = mapped_column(_TZ)


# The Core tables, typed, for the event writes that skip the ORM's bulk paths
# (`services.events.record_events`; a step's own write is one SQL statement,
# `services.tasks.step_rows`).
TASKS = cast(Table, Task.__table__)


class StepSnapshot(Base):
    """A task's sandbox's writable files after one of its steps (`sandbox.snapshots: steps`),
    as a tar (`app.sandbox.snapshot`): what a fork with `rebuild: snapshot` starts from."""

    __tablename__ = "step_snapshots"

    task_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True
    )
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    archive: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True, deferred=True)
    """The tar; None when it is the same as step `same_as`'s (a step that changed no file)."""
    same_as: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(_TZ, default=utc_now)


EVENTS = cast(Table, Event.__table__)


class ImageBuildRow(Base):
    """A tenant's own sandbox image (`/v1/images/builds`): its Dockerfile and build context,
    kept so that any worker lacking the image can build it again, and how its last build
    went."""

    __tablename__ = "image_builds"

    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    """`building`, `ready` or `failed`."""
    digest: Mapped[str] = mapped_column(String(64))
    base: Mapped[str] = mapped_column(String(64))
    """The catalogue image the final stage is built FROM."""
    reference: Mapped[str] = mapped_column(String(200))
    dockerfile: Mapped[str] = mapped_column(Text)
    """As built: its `FROM`s naming Docker references."""
    context: Mapped[bytes | None] = mapped_column(LargeBinary)
    build_args: Mapped[dict[str, str]] = mapped_column(JSONB)
    description: Mapped[str] = mapped_column(Text)
    image_config: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    """The built image's `workdir`, `user` and `env`."""
    error: Mapped[str | None] = mapped_column(Text)
    log: Mapped[str] = mapped_column(Text, default="", server_default=text("''"))
    worker: Mapped[str | None] = mapped_column(String(200))
    """The worker that built it last."""
    created_at: Mapped[datetime] = mapped_column(_TZ, default=utc_now)
    built_at: Mapped[datetime | None] = mapped_column(_TZ)
