"""Settings: every knob of Sandhive, read from `SANDHIVE_*` environment variables.

Built once at the edge (`app.cli.main`) and passed down; there is no module-level
instance. Deep code receives the values it needs, not the whole object.
`python -m app.config --markdown` prints docs/configuration.md from the fields' docstrings.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re
import sys
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app import defaults
from app.egress.rules import normalize_name, normalize_pattern, outside_ceiling

REDIS_BLOCK_MARGIN_S = 1.0
"""How much sooner than the Redis socket timeout a blocking read must end (its reply's trip)."""


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
    stream: bool = True
    """Stream answers (live `llm.delta` events); false: one plain JSON answer per call, for
    servers whose stream is broken (OpenAI-compatible kind only)."""
    session_header: bool = False
    """Send `SANDHIVE_LLM_SESSION_HEADER` (the task id) on this profile's calls: for a
    trainer's router behind it. A task's own `llm.base_url` always gets it; a provider
    never does unless its profile says so (the task id is the service's, not theirs)."""

    scripted: bool = False
    """A scripted stand-in (the built-in `scripted` profile), not a real model."""
    input_price_per_mtok: float | None = Field(default=None, ge=0)
    """Optional price of a million input tokens (any currency), shown to users."""
    output_price_per_mtok: float | None = Field(default=None, ge=0)
    """Optional price of a million output tokens."""

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models or model == self.model


SCRIPTED_PROFILE = "scripted"
"""Name of the built-in scripted profile (`SANDHIVE_SCRIPTED_PROFILE`)."""
SCRIPTED_MODELS = ("demo", "tour")
"""Its models: `demo` (three steps) and `tour` (many steps, a failing command, an edit, live
output, an image artifact); their scripts are in `app.scripted.profile`."""
NO_MODEL_NOTICE = (
    "no real model configured: set SANDHIVE_LLM_BASE_URL and SANDHIVE_LLM_MODEL (or "
    "SANDHIVE_LLM_PROFILES_FILE), or SANDHIVE_SCRIPTED_PROFILE=true for the scripted demo profile"
)

SCRIPTED_ONLY_NOTICE = (
    "only the scripted demo profile is configured (a fixed script, not a model): set "
    "SANDHIVE_LLM_BASE_URL and SANDHIVE_LLM_MODEL (or SANDHIVE_LLM_PROFILES_FILE) for a real one"
)


class Settings(BaseSettings):
    # The attribute docstrings are the settings' documentation: `settings_markdown()` turns
    # them into docs/configuration.md (`make docs`).
    model_config = SettingsConfigDict(
        env_prefix="SANDHIVE_", env_file=".env", extra="ignore", use_attribute_docstrings=True
    )

    # Where things live
    database_url: str = "postgresql+asyncpg://postgres@127.0.0.1:5432/sandhive"
    """Postgres, the source of truth."""
    database_pool_size: int | None = Field(default=None, ge=1, le=1000)
    """Postgres connections each process keeps open (up to 10 more while busy); empty: the
    worker's slots + 4, at least 5. Keep the sum over every API and worker process under
    Postgres's `max_connections` (100 by default)."""
    database_ping_bypass_s: float = Field(default=defaults.DATABASE_PING_BYPASS_S, ge=0, le=60)
    """A pooled connection given back less than this long ago is lent without a `SELECT 1`
    first (HikariCP's `aliveBypassWindowMs`): on a busy path most are, and the ping was one
    of every transaction's round trips. 0: ping at every checkout (one that died while
    pooled is then always replaced rather than failing its caller once)."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis: the task queue and live events."""
    redis_socket_timeout_s: float = Field(default=20.0, ge=2)
    """Longest wait for one Redis reply before the call fails (and is retried or reported).
    Blocking reads must end sooner: the worker's queue read takes under a second, the API's
    live-stream read `SANDHIVE_STREAM_KEEPALIVE_S`, which must be at least 1 s shorter."""
    redis_connect_timeout_s: float = Field(default=5.0, gt=0)
    """Longest wait to open a connection to Redis."""
    redis_max_connections: int = Field(default=4096, ge=16)
    """Redis connections one process may hold at once. Every blocking read holds one (each
    step waiting for its worker's answer, each live stream, each worker's queue read), so
    this must exceed the process's concurrent requests: redis-py 8 caps it at 100 unless
    told, which failed steps with 503 at 128 concurrent episodes."""
    auth: Literal["disabled", "keys"] = "keys"
    """`keys`: every `/v1` call needs an API key. `disabled`: every call is tenant `default`
    (local development only)."""
    admin_api_key: SecretStr | None = None
    """The operator's key: acts as the tenant named by the `X-Sandhive-Tenant` header
    (default `admin`)."""

    # Workers and sandboxes
    worker_concurrency: int = Field(default=4, ge=1, le=256)
    """Tasks one worker runs at once."""
    worker_name: str | None = None
    """Worker id (container label, Redis consumer); unset: `<hostname>-<pid>`."""
    worker_event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    """The worker's event loop: `uvloop` (libuv, as uvicorn runs the API) spends less CPU per
    step on its sockets than the standard library's `asyncio` loop (docs/performance.md);
    `asyncio` is there to rule the loop out when chasing a fault."""
    sandbox_image: str = "sandhive-sandbox:latest"
    """Image of the sandboxes, built from `Dockerfile.sandbox`: the catalogue's `default`."""
    sandbox_images_file: Path | None = None
    """TOML file of the image catalogue: `[images.NAME]` with `reference` or `dockerfile`,
    `description`, `defaults`/`max` resources, `pids_limit`, `tenants`, `warm_pool_size`
    (see docs/images.md); unset: only `default`."""
    sandbox_pids_limit: int = Field(default=defaults.PIDS_LIMIT, ge=16)
    """Process cap per sandbox."""
    sandbox_workdir: str = defaults.WORKDIR
    """The agent's working directory."""
    sandbox_deadline_grace_s: float = Field(default=300.0, ge=1)
    """Every sandbox ends, and Docker removes it with its volume, this long after its task's
    `timeout_s` plus `artifact_collect_grace_s`, even if its worker never comes back (see
    docs/operations.md#reliability-no-task-lost)."""

    # Fast sandboxes: the exec channel and the warm pool (docs/operations.md).
    sandbox_exec_channel: bool = True
    """Run commands through one long-lived in-sandbox agent instead of a `docker exec` each
    (see docs/operations.md#fast-sandboxes)."""
    sandbox_runtime: str = Field(
        default=defaults.SANDBOX_RUNTIME, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
    )
    """OCI runtime of the sandboxes, by the name dockerd knows it (`docker info`): `runc`,
    or `crun` (Debian's `crun`, registered by deploy/setup-host.sh), which starts and execs
    containers with less CPU under the same hardening (docs/performance.md). A name the
    daemon lacks makes the worker not ready."""
    warm_pool_size: int = Field(default=0, ge=0, le=64)
    """Ready sandboxes per worker and sandbox shape (0: none, every task starts a cold
    container)."""
    warm_pool_max_age_s: float = Field(default=defaults.WARM_POOL_MAX_AGE_S, gt=0)
    """A pooled sandbox older than this is replaced rather than handed to a task."""

    # The default LLM profile; more named profiles may come from a TOML file
    llm_base_url: str = ""
    """OpenAI-compatible base URL of the `default` profile, e.g. `http://127.0.0.1:8001/v1`."""
    llm_api_key: SecretStr = SecretStr("")
    """Its key (stays on the server, never in a task or a sandbox)."""
    llm_model: str = ""
    """Its default model."""
    llm_profiles_file: Path | None = None
    """TOML file of more named profiles: `[profiles.NAME]` with `kind`, `base_url`, `api_key`,
    `model`, `models` (see docs/agent.md#providers)."""
    llm_timeout_s: float = Field(default=defaults.LLM_TIMEOUT_S, gt=0)
    """Timeout of one LLM call."""
    llm_max_retries: int = Field(default=defaults.LLM_MAX_RETRIES, ge=0, le=10)
    """Retries of a failed LLM call (5xx, 429, connection errors)."""
    llm_retry_backoff_s: float = Field(default=defaults.LLM_RETRY_BACKOFF_S, ge=0)
    """First backoff between those retries, doubled each retry (at most 30 s)."""
    llm_allowed_base_urls: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated base URLs a task's (or an experiment arm's) `llm.base_url` may name:
    a trainer's own inference servers (docs/rl.md). Exact match, trailing `/` ignored;
    empty (the default): no task may name one (422), since a URL a tenant chose is
    otherwise a request-forgery hole. The profile's own key is never sent there (a tenant
    could otherwise point a provider's profile at a trainer URL and read its key):
    `SANDHIVE_LLM_ROLLOUT_API_KEY` is, when set. The list is the operator's, for every
    tenant: put only servers any tenant may use in it."""
    llm_rollout_api_key: SecretStr = SecretStr("")
    """Bearer key sent to a task's own `llm.base_url` (one of `SANDHIVE_LLM_ALLOWED_BASE_URLS`);
    empty (the default): none is sent."""
    llm_session_header: str = Field(default="X-Session-Id", max_length=100)
    """HTTP header carrying the task id on the model requests of a task with its own
    `llm.base_url` (and of profiles with `session_header = true`), so a trainer's router
    keeps one rollout on one inference replica (vLLM router: `X-Session-ID`; SGLang's
    gateway: `X-SMG-Routing-Key`); empty: never sent."""

    scripted_profile: bool = False
    """Offer the built-in, clearly labelled `scripted` LLM profile: a fixed script, not a model
    (models `demo` and `tour`), for trying Sandhive without one. The worker (and `sandhive run`)
    serves it in-process on a loopback port. `make run` turns it on; keep it off in production."""
    scripted_base_url: str = ""
    """Where the `scripted` profile's server is; empty: the worker serves its own (the usual
    case; set it only to share one scripted server, e.g. in a test stack)."""

    # The agent: provider kind, prompt configs, multi-call policy (docs/agent.md).
    llm_kind: Literal["openai", "anthropic"] = "openai"
    """Wire format of the `default` profile: `openai` or `anthropic` (TOML profiles say `kind`
    themselves)."""
    prompt_configs_dir: Path | None = None
    """Directory of prompt configs in the package's YAML format, `<name>.yaml`; they add to
    (or replace) the built-in ones."""
    answer_all_tool_calls: bool | None = None
    """Server default of `tools.answer_all_tool_calls`; unset: on for `standard`, off for
    `reference`."""

    # Per-task defaults (used when a task does not say) and server maxima (422 above)
    default_max_steps: int = Field(default=defaults.MAX_STEPS, ge=1)
    """Steps of a task that does not set `limits.max_steps`."""
    max_max_steps: int = Field(default=500, ge=1)
    """The most `limits.max_steps` a task may ask for."""
    default_timeout_s: int = Field(default=1800, ge=1)
    """A task's wall clock (`limits.timeout_s`) when it does not say."""
    max_timeout_s: int = Field(default=7200, ge=1)
    """The longest wall clock a task may ask for."""
    default_command_timeout_s: int = Field(default=defaults.COMMAND_TIMEOUT_S, ge=1)
    """Timeout of one command (`limits.command_timeout_s`) when the task does not say."""
    max_command_timeout_s: int = Field(default=1800, ge=1)
    """The longest command timeout a task may ask for."""
    default_max_context_tokens: int = Field(default=defaults.MAX_CONTEXT_TOKENS, ge=1024)
    """Conversation budget (`limits.max_context_tokens`; over it the task ends with
    `context_limit`) when the task does not say."""
    max_max_context_tokens: int = Field(default=1_000_000, ge=1024)
    """The largest conversation budget a task may ask for."""
    default_max_tokens_per_call: int = Field(default=8192, ge=1)
    """`max_tokens` of each completion when the task does not say."""
    max_max_tokens_per_call: int = Field(default=131072, ge=1)
    """The largest `max_tokens` per completion a task may ask for."""
    default_temperature: float = Field(default=1.0, ge=0, le=2)
    """Sampling temperature when the task does not say, as the reference package."""
    default_cpus: float = Field(default=defaults.CPUS, gt=0)
    """Sandbox CPUs when the task does not say."""
    max_cpus: float = Field(default=4.0, gt=0)
    """The most sandbox CPUs a task may ask for."""
    default_memory_mb: int = Field(default=defaults.MEMORY_MB, ge=64)
    """Sandbox memory (no swap) when the task does not say."""
    max_memory_mb: int = Field(default=8192, ge=64)
    """The most sandbox memory a task may ask for."""

    # Input bounds
    max_prompt_chars: int = Field(default=200_000, ge=1)
    """Longest prompt, in characters."""
    max_input_files: int = Field(default=100, ge=0)
    """Input files per task."""
    max_input_file_bytes: int = Field(default=10 * 2**20, ge=1)
    """Size of one input file (413 above)."""
    max_input_total_bytes: int = Field(default=50 * 2**20, ge=1)
    """Size of all of a task's input files together (413 above)."""
    max_metadata_bytes: int = Field(default=16 * 2**10, ge=2)
    """Size of a task's `metadata` as JSON."""

    # Output bounds
    artifact_max_files: int = Field(default=1000, ge=0)
    """Artifacts kept per task."""
    artifact_max_file_bytes: int = Field(default=20 * 2**20, ge=1)
    """Size of one artifact, enforced while reading the sandbox's output."""
    artifact_max_total_bytes: int = Field(default=100 * 2**20, ge=1)
    """Size of all of a task's artifacts together, enforced while reading the sandbox's
    output."""
    artifact_collect_grace_s: float = Field(default=5.0, gt=0)
    """Time the output collection still gets when the task's wall clock ran out (so partial
    output is kept); the task ends at most this long after its timeout_s."""
    answer_max_bytes: int = Field(default=64 * 2**10, ge=1)
    """Cap of a task's `answer`."""

    # Live event streams, per API process (docs/api.md).
    stream_client_buffer: int = Field(default=defaults.STREAM_CLIENT_BUFFER, ge=1)
    """Events a viewer may lag behind before it is cut off (WebSocket close 4408)."""
    stream_keepalive_s: float = Field(default=defaults.STREAM_KEEPALIVE_S, gt=0)
    """Idle streams get a keepalive this often (and re-check Postgres for a lost publish);
    keep it under 45: the page reconnects after 45 s of silence. It is also how long the
    API's read of a live stream blocks in Redis, so it must stay at least 1 s under
    `SANDHIVE_REDIS_SOCKET_TIMEOUT_S`."""

    # Security: sandbox hardening, egress, request limits (docs/security.md).
    sandbox_read_only_rootfs: bool = True
    """Read-only image filesystem; only the workdir and the scratch dirs (size-capped tmpfs)
    are writable."""
    sandbox_reference_workdir_on_disk: bool = False
    """`reference`-profile tasks get their workdir as a plain volume on the Docker host's disk
    instead of a tmpfs, so `str_replace_editor view` lists a directory in the same order as
    the package's container on that host (docs/agent.md). That workdir is NOT capped by
    `disk_mb`: a task can fill the Docker host's disk. For trusted tenants only."""
    default_disk_mb: int = Field(default=defaults.DISK_MB, ge=16)
    """Size of /testbed (`sandbox.disk_mb`) when the task does not say."""
    max_disk_mb: int = Field(default=8192, ge=16)
    """The largest /testbed a task may ask for; RAM-backed, so the container's memory limit is
    memory_mb + disk_mb."""
    sandbox_scratch_mb: int = Field(default=defaults.SCRATCH_MB, ge=16)
    """Size cap of each scratch tmpfs: /tmp, /var/tmp, /root (pip's user site), /run."""
    sandbox_egress_enabled: bool = False
    """Accept `sandbox.network: "egress"` (a dedicated, firewalled Docker network; else 422)."""
    sandbox_egress_network: str = Field(
        default="sandhive-egress", pattern=r"^[A-Za-z0-9][\w.-]{0,62}$"
    )
    """The egress Docker network."""
    sandbox_egress_bridge: str = Field(default="shv-egress0", pattern=r"^[A-Za-z0-9][\w.-]{0,14}$")
    """The Linux bridge of that network, named so the firewall rules can match it."""
    sandbox_egress_allow: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated IPv4 CIDRs egress sandboxes may reach; empty: any public address (never
    private/host ones)."""
    sandbox_egress_firewall: bool = True
    """The worker installs the egress iptables rules itself (needs root on the Docker host);
    `false`: the operator does."""
    sandbox_ca_bundle: Path | None = None
    """Extra CA bundle (host path) mounted read-only into egress sandboxes."""
    # Egress by domain name (docs/network.md): `sandbox.allow_domains` through the proxy.
    sandbox_egress_proxy: bool = False
    """Egress sandboxes go out only through the filtering proxy, by domain name
    (`sandbox.allow_domains`), instead of the CIDR-firewalled bridge above."""
    sandbox_egress_domains: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """The ceiling: comma-separated names and `*.suffix` patterns a task's `allow_domains` must
    stay within (422 naming them otherwise); empty: no name may be asked for."""
    sandbox_egress_default_domains: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """`allow_domains` of an egress task that gives none (within the ceiling)."""
    sandbox_egress_proxy_image: str | None = None
    """Image the proxy's container runs (python3 >= 3.11 needed); unset: `sandbox_image`."""
    sandbox_egress_proxy_container: str = Field(
        default="sandhive-egress-proxy", pattern=r"^[A-Za-z0-9][\w.-]{0,62}$"
    )
    """Name of the proxy's container (one per Docker host, shared by its workers)."""
    sandbox_egress_proxy_network: str = Field(
        default="sandhive-egress-out", pattern=r"^[A-Za-z0-9][\w.-]{0,62}$"
    )
    """The proxy's own way out (made as a plain bridge when missing); never the network of
    Postgres, Redis or the API."""
    sandbox_egress_proxy_dir: Path = Path("/run/sandhive-egress")
    """Host directory (same path inside a compose worker) for the proxy's code and control
    socket; root only."""
    sandbox_egress_proxy_subnets: str = "10.213.0.0/16"
    """IPv4 CIDR the per-task /28 networks come from; always refused as a destination."""
    sandbox_egress_proxy_max_connections: int = Field(default=512, ge=1)
    """Connections one task may open through the proxy, in all."""
    sandbox_egress_proxy_max_bytes: int = Field(default=2 * 2**30, ge=1)
    """Bytes (both ways) one task may move through the proxy; past it its connections are cut."""
    sandbox_egress_proxy_ports: Annotated[list[int], NoDecode] = Field(
        default_factory=lambda: [80, 443]
    )
    """Destination ports the proxy connects to."""
    sandbox_egress_proxy_exempt: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Private CIDRs the proxy may still reach (an internal mirror; tests' upstreams). Never
    opens loopback, link-local, metadata or `sandbox_egress_proxy_service` addresses."""
    sandbox_egress_proxy_service: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """CIDRs the proxy always refuses (where Postgres, Redis and the API live)."""
    sandbox_egress_proxy_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated `name=address` answers the proxy uses instead of DNS (tests, split
    horizon); the address rules still apply."""
    sandbox_egress_proxy_max_open: int = Field(default=256, ge=1)
    """Connections one task may hold open through the proxy at once (idle ones too)."""
    sandbox_egress_proxy_max_open_total: int = Field(default=4096, ge=16)
    """Connections the proxy holds open at once over all tasks; its nofile limit is twice
    this plus a margin, so no task can exhaust its file handles for the others."""
    sandbox_egress_proxy_max_refusals: int = Field(default=1000, ge=1)
    """Refused connections after which a task's egress is cut off (reports to the worker are
    rate-limited well before that)."""
    sandbox_egress_proxy_cpus: float = Field(default=1.0, gt=0, le=64)
    """CPU limit of the proxy's container."""
    max_json_body_bytes: int = Field(default=8 * 2**20, ge=1024)
    """Cap of a JSON request body (413 as soon as crossed)."""
    max_multipart_body_bytes: int = Field(default=64 * 2**20, ge=1024)
    """Cap of a multipart request body (413 as soon as crossed)."""
    request_body_timeout_s: float = Field(default=60.0, gt=0)
    """The whole request body must arrive within this time (slow-body clients get 408)."""
    allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated browser origins besides the API's own that may call it (CORS, WebSocket
    handshakes)."""
    rate_limit_per_s: float = Field(default=20.0, ge=0)
    """Sustained /v1 requests per second per tenant (a token bucket in Redis; 429 +
    `Retry-After`; 0: no rate limit)."""
    rate_limit_burst: int = Field(default=100, ge=1)
    """Burst of that per-tenant token bucket."""
    api_header_timeout_s: float = Field(default=defaults.API_HEADER_TIMEOUT_S, gt=0)
    """A connection whose request line and headers are not complete this long after it opened
    (or after the previous response) is closed: slowloris and silent sockets."""
    api_max_connections: int = Field(default=500, ge=2)
    """Open connections (WebSockets included) one API process serves; past it: 503."""
    api_access_log: bool = True
    """One INFO line per request (and WebSocket handshake) on uvicorn's access log; off: no
    such line is formatted or written (errors are still logged), for a deployment whose proxy
    or load balancer keeps the access log already."""
    stream_max_per_tenant: int = Field(default=200, ge=1)
    """Open WebSocket + SSE streams per tenant, all API processes together (4429 / 429)."""

    # Webhooks (docs/calling-services.md)
    webhook_allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated host names, addresses or CIDRs webhooks may reach although they are
    loopback, private, link-local or metadata addresses (refused by default)."""
    webhook_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated `name=address` answers the webhook sender uses instead of DNS (split
    horizon, tests); the address rules still apply."""
    webhook_max_subscriptions: int = Field(default=20, ge=1)
    """Webhook subscriptions per tenant (422 above)."""
    webhook_poll_s: float = Field(default=1.0, gt=0)
    """How often a worker looks for webhook deliveries that are due."""
    webhook_batch: int = Field(default=20, ge=1)
    """Deliveries one worker sends at once."""
    webhook_timeout_s: float = Field(default=10.0, gt=0)
    """One delivery attempt, connect to response, at most."""
    webhook_max_response_bytes: int = Field(default=64 * 1024, ge=0)
    """Of a receiver's response body, read at most this much (the rest is dropped)."""
    webhook_lease_s: float = Field(default=60.0, gt=0)
    """A sender holds a delivery this long; past it another worker may send it."""
    webhook_retry_base_s: float = Field(default=5.0, gt=0)
    """First retry delay; doubled per attempt (with jitter: 50-100 % of it)."""
    webhook_retry_max_delay_s: float = Field(default=3600.0, gt=0)
    """Longest delay between two attempts of one delivery."""
    webhook_retry_for_s: float = Field(default=24 * 3600.0, gt=0)
    """A delivery is retried this long after its event, then marked `failed`."""
    webhook_expiring_lead_s: float = Field(default=60.0, ge=0)
    """`task.expiring` is sent this long before a running task's `limits.timeout_s` runs out
    (at once when less is left as an attempt starts); 0: never."""

    @field_validator(
        "sandbox_egress_allow",
        "sandbox_egress_domains",
        "sandbox_egress_default_domains",
        "sandbox_egress_proxy_ports",
        "sandbox_egress_proxy_exempt",
        "sandbox_egress_proxy_service",
        "sandbox_egress_proxy_hosts",
        "allowed_origins",
        "webhook_allowed_hosts",
        "webhook_hosts",
        "llm_allowed_base_urls",
        mode="before",
    )
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

    @field_validator("sandbox_egress_domains", "sandbox_egress_default_domains")
    @classmethod
    def _domain_patterns(cls, value: list[str]) -> list[str]:
        """Names and `*.suffix` only, normalized: IP literals and bare `*` are refused."""
        return [normalize_pattern(item) for item in value]

    @field_validator("sandbox_egress_proxy_hosts", "webhook_hosts")
    @classmethod
    def _host_answers(cls, value: list[str]) -> list[str]:
        for item in value:
            name, _, address = item.partition("=")
            normalize_name(name)
            ipaddress.ip_address(address.strip())
        return value

    @field_validator("sandbox_egress_proxy_subnets")
    @classmethod
    def _subnet_pool(cls, value: str) -> str:
        pool = ipaddress.IPv4Network(value)
        if pool.prefixlen > 28:
            raise ValueError(f"{value!r} is smaller than one /28")
        return str(pool)

    @model_validator(mode="after")
    def _default_domains_within_ceiling(self) -> Settings:
        wider = outside_ceiling(self.sandbox_egress_default_domains, self.sandbox_egress_domains)
        if wider:
            raise ValueError(f"sandbox_egress_default_domains outside the ceiling: {wider}")
        return self

    # Reliability: leases, reclaim, reconciliation, reaping, shutdown, backpressure
    # (docs/operations.md). A worker renews the lease of each task it runs every
    # `worker_heartbeat_s`; a task whose lease is older than `worker_lease_s` is reclaimed by
    # another worker as a new attempt.
    instance: str | None = None
    """`sandhive.instance` label of this deployment's sandboxes: the reaper removes only these;
    unset: the database's name."""
    worker_lease_s: float = Field(default=30.0, gt=0)
    """A task whose worker stopped renewing its lease this long is reclaimed (a new attempt)."""
    worker_heartbeat_s: float = Field(default=10.0, gt=0)
    """How often a worker says it is alive and renews its leases (below the lease)."""
    worker_max_attempts: int = Field(default=3, ge=1, le=100)
    """Attempts a task may lose to dead workers before it fails with `worker_lost`."""
    worker_shutdown_grace_s: float = Field(default=30.0, ge=0)
    """After SIGTERM, running tasks get this long before they are handed back."""
    worker_reconcile_interval_s: float = Field(default=60.0, gt=0)
    """How often a worker re-enqueues what Postgres says must run but Redis lacks."""
    worker_reap_interval_s: float = Field(default=10.0, gt=0)
    """How often a worker removes sandboxes of finished tasks and dead workers."""
    worker_cancel_poll_s: float = Field(default=0.5, gt=0)
    """How often a worker checks for cancels of the tasks it runs."""
    queue_max_depth: int = Field(default=10_000, ge=1)
    """Queued tasks (all tenants) beyond which a submission is answered 429."""
    tenant_max_active_tasks: int = Field(default=1_000, ge=1)
    """Queued + running tasks of one tenant beyond which its submissions are answered 429."""
    backpressure_retry_after_s: int = Field(default=5, ge=1)
    """The `Retry-After` of those 429s."""
    refuse_tasks_without_image_worker: bool = False
    """Answer a task (or a batch) of an image no live worker's heartbeat lists with 503
    `no_worker_for_image`, nothing stored; off: it is accepted and waits for such a worker
    (`sandhive_image_workers` on /metrics shows 0; docs/images.md)."""
    max_batch_tasks: int = Field(default=100, ge=1, le=1000)
    """Tasks one `POST /v1/tasks/batch` may carry (422 above); admitted or refused together."""
    episode_slots: int = Field(default=16, ge=0, le=1024)
    """Episodes (`/v1/episodes`) one worker holds open at once, besides its task slots;
    0: this worker opens none."""
    episode_open_timeout_s: float = Field(default=60.0, gt=0)
    """How long `POST /v1/episodes` waits for a worker to start the sandbox (503 after)."""
    episode_step_timeout_s: float = Field(default=900.0, gt=0)
    """How long a step or close waits for the worker's answer before the episode is ended
    with an infrastructure error (503); above the longest command timeout."""
    episode_step_key_ttl_s: float = Field(default=3600.0, gt=0)
    """How long a step's answer is kept for repeats with its `Idempotency-Key`."""
    episode_idle_timeout_s: float = Field(default=600.0, gt=0)
    """An episode with no request for this long is closed and its sandbox removed."""
    fork_max_children: int = Field(default=64, ge=1, le=1024)
    """Children one fork may ask for (`n` of `POST /v1/episodes/{id}/fork` or
    `/v1/tasks/{id}/fork`; 422 above). Each counts against the tenant's cap; an episode's
    children each hold an episode slot of the parent's worker."""
    fork_max_snapshot_mb: int = Field(default=1024, ge=1)
    """The largest snapshot of a parent's writable files a fork takes (held in the worker's
    memory while the children start); a larger one is refused (422) before any child starts."""
    snapshot_max_mb: int = Field(default=256, ge=1)
    """The largest snapshot a task with `sandbox.snapshots: steps` stores after a step; a
    step whose files are more stores none (a fork from it must replay)."""
    snapshot_retention_s: float = Field(default=7 * 86400.0, gt=0)
    """How long step snapshots are kept (a worker deletes older ones every
    `SANDHIVE_WORKER_REAP_INTERVAL_S`); a fork from a step whose snapshot went is a 409."""
    fork_timeout_s: float = Field(default=300.0, gt=0)
    """How long a fork waits for its worker's answer (the snapshot and every child's start)."""
    sandbox_slots: int = Field(default=16, ge=0, le=1024)
    """Sandboxes (`/v1/sandboxes`) one worker holds at once, besides its task and episode
    slots; 0: this worker makes none."""
    tenant_max_sandboxes: int = Field(default=32, ge=1)
    """Sandboxes one tenant may have starting or running at once (429 above)."""
    sandbox_max_lifetime_s: int = Field(default=6 * 3600, ge=60)
    """The longest a sandbox lives from its creation, however often its TTL is extended:
    its container ends itself then even if every worker died (a warm one up to
    `SANDHIVE_WARM_POOL_MAX_AGE_S` later; docs/sandboxes.md)."""
    sandbox_allow_writable_rootfs: bool = False
    """Let `POST /v1/sandboxes` ask for `read_only_rootfs: false` (422 otherwise): its writes
    land in the container's layer on the Docker host's disk, unbounded by `disk_mb`; turn on
    for harnesses that install packages or add users at run time (docs/sandboxes.md)."""
    e2b_api: bool = True
    """Serve the E2B API (`/e2b`, `/e2b/envd`) over the sandboxes, so the `e2b` SDK and the
    tools built on it run here (docs/e2b.md); needs the `e2b` extra installed."""
    sandbox_max_concurrent_requests: int = Field(default=8, ge=1)
    """Commands and file requests one sandbox serves at once; more wait their turn (and are
    dropped once their caller stopped waiting)."""
    sandbox_worker_max_concurrent_requests: int = Field(default=64, ge=1)
    """Commands and file requests one worker serves at once, over all its sandboxes."""
    sandbox_create_timeout_s: float = Field(default=60.0, gt=0)
    """How long `POST /v1/sandboxes` waits for a worker to start it (503 after)."""
    sandbox_warm_pool_size: int = Field(default=0, ge=0, le=1024)
    """Started, never-used sandboxes one worker keeps ready for `POST /v1/sandboxes` (and the
    E2B API) of the default shape: no resources, env or writable root asked for; 0: none.
    A create that finds one answers without starting a container; each waiting one holds
    its memory on the host (docs/sandboxes.md#warm-sandboxes)."""
    sandbox_start_concurrency: int = Field(default=8, ge=1, le=1024)
    """New containers one worker starts at once for `POST /v1/sandboxes`; more creates wait
    their turn (one whose caller stopped waiting starts none), so a burst on a small host
    finishes one by one rather than all late together."""
    sandbox_exec_timeout_s: float = Field(default=600.0, gt=0)
    """A command's timeout when its request names none (the request may ask for longer)."""
    sandbox_exec_max_output_bytes: int = Field(default=16 * 2**20, ge=2, le=256 * 2**20)
    """Bytes of each of a command's stdout and stderr kept (the rest dropped, `*_truncated`)."""
    sandbox_exec_max_stdin_bytes: int = Field(default=64 * 2**20, ge=0, le=512 * 2**20)
    """Largest stdin a command request may carry (413 above); it travels through Redis."""
    sandbox_files_max_bytes: int = Field(default=128 * 2**20, ge=1, le=512 * 2**20)
    """Largest file `GET`/`PUT /v1/sandboxes/{id}/files` reads or writes (413 above)."""
    image_builds: bool = False
    """Let tenants build their own sandbox images from a Dockerfile (`POST
    /v1/images/builds`; 403 otherwise). Its `RUN` steps run in Docker's build containers,
    with no network and the limits below but under Docker's default confinement, not the
    sandbox's hardening or runtime: turn on only for tenants you would let run code under
    plain Docker (docs/images.md#tenant-images). `make run` turns it on."""
    image_build_max_bytes: int = Field(default=32 * 2**20, ge=1024, le=512 * 2**20)
    """Largest build request (its Dockerfile and base64 build context; 413 above): the
    context is kept in Postgres, so any worker can build the image again."""
    image_build_timeout_s: float = Field(default=900.0, gt=0)
    """How long one build may take (it fails after; the request waits this long)."""
    image_build_memory_mb: int = Field(default=4096, ge=64)
    """Memory of each build step's container."""
    image_build_cpus: float = Field(default=2.0, gt=0)
    """CPU cores of each build step's container."""
    image_build_max_concurrent: int = Field(default=1, ge=1)
    """Builds one worker runs at once (more wait their turn)."""
    tenant_max_image_builds: int = Field(default=50, ge=1)
    """Images one tenant may keep built (409 above: delete one first)."""
    verifier_default_timeout_s: int = Field(default=600, ge=1)
    """A task's verifier (Harbor's tests/test.sh) runs this long unless it asks otherwise."""
    verifier_max_timeout_s: int = Field(default=3600, ge=1)
    """The longest a task's verifier may ask to run (422 beyond)."""
    verifier_max_bytes: int = Field(default=4 * 2**20, ge=1)
    """The verifier's files together, decoded (422 beyond): they are kept in the task's row."""
    verifier_output_bytes: int = Field(default=16 * 2**10, ge=256)
    """The end of the verifier's stdout and stderr kept on the task, each."""
    task_files_max_read_bytes: int = Field(default=10 * 2**20, ge=1)
    """Largest file `GET /v1/tasks/{id}/files/{path}` reads from a running sandbox (413 above)."""
    task_files_max_write_bytes: int = Field(default=10 * 2**20, ge=0, le=256 * 2**20)
    """Largest body `PUT /v1/tasks/{id}/files/{path}` writes into a running sandbox (413 above);
    it travels through Redis to the worker holding the sandbox, so keep it modest."""
    task_files_max_entries: int = Field(default=1000, ge=1, le=100_000)
    """Entries one listing of a running task's directory returns (sorted by name; `truncated`)."""
    task_files_timeout_s: float = Field(default=30.0, gt=0)
    """How long a file request waits for the worker holding the sandbox (504 after)."""
    task_files_max_concurrent_per_task: int = Field(default=2, ge=1)
    """File requests one task's sandbox serves at once (each is a `python3` in it); more wait
    their turn, and are dropped when their caller has stopped waiting."""
    task_files_max_concurrent_per_worker: int = Field(default=8, ge=1)
    """File requests one worker serves at once, over all its tasks' sandboxes."""
    experiment_tick_s: float = Field(default=1.0, gt=0)
    """How often a worker advances experiments: scores finished items, starts pending ones."""
    experiment_max_rows: int = Field(default=10_000, ge=1)
    """Dataset rows per experiment (422 above)."""
    experiment_max_arms: int = Field(default=8, ge=1)
    """Arms per experiment (422 above)."""
    experiment_max_attempts: int = Field(default=16, ge=1)
    """Attempts per row and arm in an experiment (422 above)."""
    experiment_max_items: int = Field(default=100_000, ge=1)
    """Rows x arms x attempts of one experiment (422 above)."""
    experiment_max_concurrency: int = Field(default=256, ge=1)
    """Most items of one experiment running at once (422 above)."""
    experiment_scorer_code_max_bytes: int = Field(
        default=defaults.PYTHON_SCORER_CODE_MAX_BYTES, ge=1
    )
    """Size of a `python` scorer's code (UTF-8 bytes; 422 above)."""
    experiment_python_scorer_timeout_s: int = Field(default=defaults.PYTHON_SCORER_TIMEOUT_S, ge=1)
    """Wall clock of one `python` scorer run when its spec gives no `timeout_s`; past it the
    sandbox is removed and the item is a `scorer` error."""
    experiment_python_scorer_max_timeout_s: int = Field(
        default=defaults.PYTHON_SCORER_MAX_TIMEOUT_S, ge=1
    )
    """Largest `timeout_s` a `python` scorer may ask for (422 above)."""
    experiment_python_scorer_memory_mb: int = Field(default=defaults.PYTHON_SCORER_MEMORY_MB, ge=64)
    """Memory of a `python` scorer's sandbox when its spec gives no `memory_mb`."""
    experiment_python_scorer_max_memory_mb: int = Field(
        default=defaults.PYTHON_SCORER_MAX_MEMORY_MB, ge=64
    )
    """Largest `memory_mb` a `python` scorer may ask for (422 above)."""
    experiment_python_scorer_output_bytes: int = Field(
        default=defaults.PYTHON_SCORER_OUTPUT_BYTES, ge=1024
    )
    """stdout and stderr kept of each `python` scorer run (each; head and tail past it) when its
    spec gives no `output_bytes`."""
    experiment_python_scorer_max_output_bytes: int = Field(
        default=defaults.PYTHON_SCORER_MAX_OUTPUT_BYTES, ge=1024
    )
    """Largest `output_bytes` a `python` scorer may ask for (422 above)."""
    experiment_python_scorer_pids_limit: int = Field(
        default=defaults.PYTHON_SCORER_PIDS_LIMIT, ge=8
    )
    """Processes and threads in a `python` scorer's sandbox: what a fork bomb runs into."""
    experiment_python_scorer_scratch_mb: int = Field(
        default=defaults.PYTHON_SCORER_SCRATCH_MB, ge=1
    )
    """Size of each writable tmpfs (`/tmp`, ...) of a `python` scorer's sandbox; the rest of its
    file system is read-only."""
    experiment_max_dataset_bytes: int = Field(default=32 * 2**20, ge=1024)
    """Size of a dataset file uploaded to `POST /v1/experiments` (413 above); the multipart
    body as a whole is also capped by `SANDHIVE_MAX_MULTIPART_BODY_BYTES`."""
    experiment_stream_poll_s: float = Field(default=1.0, gt=0)
    """How often an experiment's event stream re-reads Postgres when no wake-up came (a lost
    Redis publish costs at most this); never longer than `SANDHIVE_STREAM_KEEPALIVE_S`."""
    experiment_scoring_concurrency: int = Field(default=8, ge=1)
    """Answers one worker scores at once with a slow scorer (`llm_judge`, `python`)."""
    experiment_scoring_timeout_s: float = Field(default=600.0, gt=0)
    """The longest one slow scoring may take (all of a judge's repeats, or a `python`
    scorer's container and run); past it the item ends `error` of kind `scorer`."""
    experiment_scoring_lease_margin_s: float = Field(default=30.0, gt=0)
    """How long a worker's claim on an answer it scores outlasts the scoring timeout: a
    worker that died scoring it has its answers rescored by another after that."""
    scoring_processes: int = Field(default=2, ge=1)
    """Processes per API or worker process that run the built-in scorers (`exact`, `math`,
    `regex`, ...), so a slow answer never stalls the process's event loop."""
    scoring_timeout_s: float = Field(default=10.0, gt=0)
    """The longest a built-in scorer may take on one answer; past it its process is killed
    and the item (or reward) is a `scorer` error."""
    experiment_scoring_max_claims: int = Field(default=3, ge=1)
    """How many times an answer's slow scoring may be taken up without a result (its worker
    died, or the scoring failed in a way worth retrying, such as Docker being unreachable)
    before the item ends `error` of kind `infrastructure` ("scoring failed N times"): not
    scored, and a regrade scores it again."""
    experiment_scoring_retry_s: float = Field(default=120.0, gt=0)
    """After a try the infrastructure failed (a `python` scorer's sandbox that Docker could
    not make or run), how long until the next; doubled at each further try."""
    experiment_retry_backoff_s: float = Field(default=30.0, ge=0)
    """How long an experiment's item whose task the service failed waits before it runs
    again (its `infrastructure_retries`), doubled at each further retry: an outage of the
    model server or of Docker is waited out, not used up in seconds."""
    unavailable_retry_after_s: int = Field(default=5, ge=1)
    """The `Retry-After` of the 503s a call gets while Postgres (`database_unavailable`) or
    Redis (`redis_unavailable`) is unreachable."""

    # Operations: logs, the worker's metrics endpoint, retention of finished tasks
    # (docs/operations.md).
    log_format: Literal["text", "json"] = "text"
    """`json`: one JSON object per line, with task_id/attempt/tenant on lines about a task
    (the service image sets `json`; see docs/operations.md#logs)."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """`DEBUG`, `INFO`, `WARNING` or `ERROR`."""
    worker_metrics_port: int = Field(default=0, ge=0, le=65535)
    """Port of the worker's own Prometheus `/metrics` (histograms, counters), `/healthz` and
    `/readyz`; 0: not served."""
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

    @model_validator(mode="after")
    def _python_scorer_defaults_within_maxima(self) -> Settings:
        """Else every `python` scorer relying on a default would be refused."""
        for name in ("timeout_s", "memory_mb", "output_bytes"):
            default = getattr(self, f"experiment_python_scorer_{name}")
            most = getattr(self, f"experiment_python_scorer_max_{name}")
            if default > most:
                raise ValueError(
                    f"experiment_python_scorer_{name} ({default}) must not exceed "
                    f"experiment_python_scorer_max_{name} ({most})"
                )
        return self

    @model_validator(mode="after")
    def _blocking_reads_below_socket_timeout(self) -> Settings:
        """A blocking read that outlasts the socket timeout fails every time Redis is idle:
        live-only events would then arrive late or never."""
        if self.stream_keepalive_s + REDIS_BLOCK_MARGIN_S > self.redis_socket_timeout_s:
            raise ValueError(
                f"stream_keepalive_s ({self.stream_keepalive_s:g}) must be at least "
                f"{REDIS_BLOCK_MARGIN_S:g} s shorter than redis_socket_timeout_s "
                f"({self.redis_socket_timeout_s:g}): raise SANDHIVE_REDIS_SOCKET_TIMEOUT_S"
            )
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
        if self.scripted_profile:
            profiles[SCRIPTED_PROFILE] = LLMProfile(
                base_url=self.scripted_base_url,
                model=SCRIPTED_MODELS[0],
                models=list(SCRIPTED_MODELS),
                scripted=True,
            )
        return profiles

    def no_model_notice(self) -> str | None:
        """What to set when no real model is configured (start-up logs, the page); else None."""
        if any(not p.scripted for p in self.llm_profiles().values()):
            return None
        if self.scripted_profile:
            return SCRIPTED_ONLY_NOTICE
        return NO_MODEL_NOTICE


@functools.lru_cache(maxsize=8)
def _read_profiles(path: Path, mtime_ns: int) -> dict[str, LLMProfile]:
    """Parsed once per version of the file (keyed by mtime), not on every submit and attempt."""
    data = tomllib.loads(path.read_text())
    return {name: LLMProfile.model_validate(t) for name, t in data.get("profiles", {}).items()}


SETTINGS_DOC_HEADER = """\
# Configuration

<!-- Generated from the field docstrings of app.config.Settings by `make docs`
(`python -m app.config --markdown > docs/configuration.md`): edit those, not this file. -->

One `Settings` class (`app/config.py`), read from `SANDHIVE_*` environment variables (and a
`.env` file in the working directory; under `docker compose` every one of them can go in `.env`,
and `deploy/env.example` lists the usual ones). A `DEFAULT_*` setting is what a task gets when
it does not say; a task asking for more than the matching `MAX_*` gets a 422. Lists are
comma-separated (`a,b`) or a JSON list.

"""


def settings_markdown() -> str:
    """docs/configuration.md: one row per setting, its meaning from the field's docstring."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = _default_text(name, field.get_default(call_default_factory=True))
        meaning = " ".join((field.description or "").split())
        # From docs/configuration.md, docs/agent.md#providers is the link agent.md#providers.
        meaning = re.sub(r"\bdocs/([\w-]+\.md)(#[\w-]+)?", r"[\1](\1\2)", meaning)
        meaning = meaning.replace("|", r"\|")
        rows.append(f"| `SANDHIVE_{name.upper()}` | {default} | {meaning} |")
    return SETTINGS_DOC_HEADER + "\n".join(rows) + "\n"


def _default_text(name: str, default: object) -> str:
    if isinstance(default, SecretStr):
        default = default.get_secret_value()
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if default == "" or default == []:
        return "empty"
    if isinstance(default, int) and name.endswith("_bytes"):
        for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
            if default >= size and default % size == 0:
                return f"{default // size} {unit}"
    if isinstance(default, float) and default.is_integer():
        default = int(default)
    return f"`{default}`"


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m app.config --markdown > docs/configuration.md")
    sys.stdout.write(settings_markdown())
