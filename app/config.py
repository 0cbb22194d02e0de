"""Settings: every knob of Sandhive, read from `SANDHIVE_*` environment variables.

Built once at the edge (`app.cli`) and passed down; there is no module-level
instance. Deep code receives the values it needs, not the whole object.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class LLMProfile(BaseModel):
    """A server-side model provider: where to call and with which key."""

    kind: Literal["openai", "anthropic"] = "openai"
    """Wire format: OpenAI-compatible chat completions, or Anthropic's Messages API."""
    base_url: str
    api_key: SecretStr = SecretStr("")
    model: str = ""
    """The default model of the profile."""
    models: list[str] = Field(default_factory=list)
    """Models a task may ask for; empty: any (the default model is always allowed)."""

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models or model == self.model


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SANDHIVE_", env_file=".env", extra="ignore")

    # Where things live
    database_url: str = "postgresql+asyncpg://postgres@127.0.0.1:5432/sandhive"
    redis_url: str = "redis://127.0.0.1:6379/0"
    auth: Literal["disabled", "keys"] = "keys"
    """`keys`: every /v1 call needs an API key. `disabled`: everyone is `default` (development)."""
    admin_api_key: SecretStr | None = None

    # Workers and sandboxes
    worker_concurrency: int = Field(default=4, ge=1, le=256)
    worker_name: str | None = None
    sandbox_image: str = "sandhive-sandbox:latest"
    sandbox_pids_limit: int = Field(default=512, ge=16)
    sandbox_workdir: str = "/testbed"

    # Fast sandboxes (issue 7). See README "Performance".
    sandbox_exec_channel: bool = True
    """Run commands through one long-lived in-sandbox agent instead of a `docker exec` each."""
    warm_pool_size: int = Field(default=0, ge=0, le=64)
    """Ready sandboxes per worker and sandbox shape (0: none, every task starts cold)."""
    warm_pool_max_age_s: float = Field(default=600.0, gt=0)
    """A pooled sandbox older than this is replaced rather than handed to a task."""

    # The default LLM profile; more named profiles may come from a TOML file
    llm_base_url: str = ""
    llm_api_key: SecretStr = SecretStr("")
    llm_model: str = ""
    llm_profiles_file: Path | None = None
    llm_timeout_s: float = Field(default=1200.0, gt=0)
    llm_max_retries: int = Field(default=3, ge=0, le=10)
    llm_retry_backoff_s: float = Field(default=1.0, ge=0)

    # The agent (issue 6): provider kind, prompt configs, multi-call policy. See README "The agent".
    llm_kind: Literal["openai", "anthropic"] = "openai"
    """Wire format of the `default` profile (TOML profiles say `kind` themselves)."""
    prompt_configs_dir: Path | None = None
    """Prompt configs in the package's YAML format, `<name>.yaml`; they add to (or replace)
    the built-in ones."""
    answer_all_tool_calls: bool | None = None
    """Server default of `tools.answer_all_tool_calls`; None: on for `standard`, off for
    `reference`."""

    # Per-task defaults (used when a task does not say) and server maxima (422 above)
    default_max_steps: int = Field(default=100, ge=1)
    max_max_steps: int = Field(default=500, ge=1)
    default_timeout_s: int = Field(default=1800, ge=1)
    max_timeout_s: int = Field(default=7200, ge=1)
    default_command_timeout_s: int = Field(default=120, ge=1)
    max_command_timeout_s: int = Field(default=1800, ge=1)
    default_max_context_tokens: int = Field(default=65536, ge=1024)
    max_max_context_tokens: int = Field(default=1_000_000, ge=1024)
    default_max_tokens_per_call: int = Field(default=8192, ge=1)
    max_max_tokens_per_call: int = Field(default=131072, ge=1)
    default_temperature: float = Field(default=1.0, ge=0, le=2)
    default_cpus: float = Field(default=1.0, gt=0)
    max_cpus: float = Field(default=4.0, gt=0)
    default_memory_mb: int = Field(default=1024, ge=64)
    max_memory_mb: int = Field(default=8192, ge=64)

    # Input bounds
    max_prompt_chars: int = Field(default=200_000, ge=1)
    max_input_files: int = Field(default=100, ge=0)
    max_input_file_bytes: int = Field(default=10 * 2**20, ge=1)
    max_input_total_bytes: int = Field(default=50 * 2**20, ge=1)
    max_metadata_bytes: int = Field(default=16 * 2**10, ge=2)

    # Output bounds
    artifact_max_files: int = Field(default=1000, ge=0)
    artifact_max_file_bytes: int = Field(default=20 * 2**20, ge=1)
    artifact_max_total_bytes: int = Field(default=100 * 2**20, ge=1)
    artifact_collect_grace_s: float = Field(default=5.0, gt=0)
    """Time the output collection still gets when the task's wall clock ran out (so partial
    output is kept); the task ends at most this long after its timeout_s."""
    answer_max_bytes: int = Field(default=64 * 2**10, ge=1)

    # Live event streams (issue 3), per API process. See README "Watching tasks live".
    stream_client_buffer: int = Field(default=1000, ge=1)
    """Events a viewer may lag behind before it is cut off (WebSocket close 4408)."""
    stream_keepalive_s: float = Field(default=15.0, gt=0)
    """Idle streams get a keepalive this often (and re-check Postgres for a lost publish)."""

    # Security (issue 5): sandbox hardening, egress, request limits. See README "Security".
    sandbox_read_only_rootfs: bool = True
    """Read-only image filesystem; /testbed and the scratch dirs are size-capped tmpfs."""
    default_disk_mb: int = Field(default=1024, ge=16)
    max_disk_mb: int = Field(default=8192, ge=16)
    """/testbed's size cap; RAM-backed, so the container's memory limit is memory_mb + disk_mb."""
    sandbox_scratch_mb: int = Field(default=256, ge=16)
    """Size cap of each scratch tmpfs: /tmp, /var/tmp, /root (pip's user site), /run."""
    sandbox_egress_enabled: bool = False
    """Accept `sandbox.network: "egress"` (a dedicated, firewalled Docker network)."""
    sandbox_egress_network: str = Field(
        default="sandhive-egress", pattern=r"^[A-Za-z0-9][\w.-]{0,62}$"
    )
    sandbox_egress_bridge: str = Field(default="shv-egress0", pattern=r"^[A-Za-z0-9][\w.-]{0,14}$")
    """The Linux bridge of that network, named so the firewall rules can match it."""
    sandbox_egress_allow: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """CIDRs egress sandboxes may reach; empty: any public address (never private/host ones)."""
    sandbox_egress_firewall: bool = True
    """The worker installs the egress iptables rules itself (needs root on the Docker host)."""
    sandbox_ca_bundle: Path | None = None
    """Extra CA bundle (host path) mounted read-only into egress sandboxes."""
    max_json_body_bytes: int = Field(default=8 * 2**20, ge=1024)
    max_multipart_body_bytes: int = Field(default=64 * 2**20, ge=1024)
    request_body_timeout_s: float = Field(default=60.0, gt=0)
    """The whole request body must arrive within this time (slow-body clients get 408)."""
    allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Browser origins besides the API's own that may call it (CORS, WebSocket handshakes)."""
    rate_limit_per_s: float = Field(default=20.0, ge=0)
    """Sustained /v1 requests per second per tenant (0: no rate limit)."""
    rate_limit_burst: int = Field(default=100, ge=1)
    api_header_timeout_s: float = Field(default=10.0, gt=0)
    """A connection whose request line and headers are not complete this long after it opened
    (or after the previous response) is closed: slowloris and silent sockets."""
    api_max_connections: int = Field(default=500, ge=2)
    """Open connections (WebSockets included) one API process serves; past it: 503."""
    stream_max_per_tenant: int = Field(default=200, ge=1)
    """Open WebSocket + SSE streams per tenant, all API processes together (4429 / 429)."""

    @field_validator("sandbox_egress_allow", "allowed_origins", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        """`a,b` or a JSON list in the environment; a list from code."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [item.strip() for item in text.split(",") if item.strip()]
        return value

    @field_validator("sandbox_egress_allow")
    @classmethod
    def _ipv4_cidrs(cls, value: list[str]) -> list[str]:
        """Refused at start-up, not when the first egress task fails: names and IPv6 are
        not supported (the firewall matches IPv4 addresses; the egress network has no IPv6)."""
        for item in value:
            try:
                network = ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"not an IPv4 address or CIDR: {item!r}") from None
            if network.version != 4:
                raise ValueError(f"only IPv4 CIDRs are supported, got {item!r}")
            if network.prefixlen == 0:  # allowed CIDRs pass the host's INPUT rules as well
                raise ValueError(f"{item!r} would open the host: leave the list empty instead")
        return value

    # Reliability (issue 4): leases, reclaim, reconciliation, reaping, shutdown, backpressure.
    # A worker renews the lease of each task it runs every `worker_heartbeat_s`; a task whose
    # lease is older than `worker_lease_s` is reclaimed by another worker as a new attempt.
    instance: str | None = None
    """Label of this deployment's containers (reaped only by it); default: the database name."""
    worker_lease_s: float = Field(default=30.0, gt=0)
    worker_heartbeat_s: float = Field(default=10.0, gt=0)
    worker_max_attempts: int = Field(default=3, ge=1, le=100)
    """Attempts a task may lose to dead workers before it fails with `worker_lost`."""
    worker_shutdown_grace_s: float = Field(default=30.0, ge=0)
    worker_reconcile_interval_s: float = Field(default=60.0, gt=0)
    worker_reap_interval_s: float = Field(default=10.0, gt=0)
    worker_cancel_poll_s: float = Field(default=0.5, gt=0)
    queue_max_depth: int = Field(default=10_000, ge=1)
    """Queued tasks (all tenants) beyond which a submission is answered 429."""
    tenant_max_active_tasks: int = Field(default=1_000, ge=1)
    """Queued + running tasks of one tenant beyond which its submissions are answered 429."""
    backpressure_retry_after_s: int = Field(default=5, ge=1)

    # Operations (issue 8): logs, the worker's metrics endpoint, retention of finished tasks.
    log_format: Literal["text", "json"] = "text"
    """`json`: one JSON object per line, with task_id/attempt/tenant on lines about a task."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    worker_metrics_port: int = Field(default=0, ge=0, le=65535)
    """Port of the worker's own Prometheus `/metrics` (histograms, counters); 0: not served."""
    worker_ready_check_s: float = Field(default=10.0, gt=0)
    """How often a worker checks Postgres, Redis and Docker for its `/readyz` (metrics port)."""
    task_retention_days: float = Field(default=30.0, gt=0)
    """`sandhive admin prune` deletes tasks finished longer ago than this (with everything)."""
    artifact_retention_days: float = Field(default=7.0, gt=0)
    """`sandhive admin prune` deletes the artifacts of tasks finished longer ago than this."""

    @model_validator(mode="after")
    def _heartbeat_below_lease(self) -> Settings:
        if self.worker_heartbeat_s >= self.worker_lease_s:
            raise ValueError("worker_heartbeat_s must be shorter than worker_lease_s")
        return self

    def instance_name(self) -> str:
        """Which containers are ours to reap: the setting, else the database's name."""
        return self.instance or self.database_url.rsplit("/", 1)[-1].split("?")[0] or "sandhive"

    def llm_profiles(self) -> dict[str, LLMProfile]:
        """Named providers: `default` from the environment, others from the TOML file."""
        profiles: dict[str, LLMProfile] = {}
        if self.llm_base_url:
            profiles["default"] = LLMProfile(
                kind=self.llm_kind,
                base_url=self.llm_base_url,
                api_key=self.llm_api_key,
                model=self.llm_model,
            )
        if self.llm_profiles_file is not None:
            path = self.llm_profiles_file
            profiles.update(_read_profiles(path, path.stat().st_mtime_ns))
        return profiles


@functools.lru_cache(maxsize=8)
def _read_profiles(path: Path, mtime_ns: int) -> dict[str, LLMProfile]:
    """Parsed once per version of the file (keyed by mtime), not on every submit and attempt."""
    data = tomllib.loads(path.read_text())
    return {name: LLMProfile.model_validate(t) for name, t in data.get("profiles", {}).items()}
