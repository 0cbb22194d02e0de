"""Settings: every knob of Sandhive, read from `SANDHIVE_*` environment variables.

Built once at the edge (`app.cli`) and passed down; there is no module-level
instance. Deep code receives the values it needs, not the whole object.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class LLMProfile(BaseModel):
    """A server-side model provider: where to call and with which key."""

    base_url: str
    api_key: SecretStr = SecretStr("")
    model: str = ""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SANDHIVE_", env_file=".env", extra="ignore")

    # Where things live
    database_url: str = "postgresql+asyncpg://postgres@127.0.0.1:5432/sandhive"
    redis_url: str = "redis://127.0.0.1:6379/0"
    auth: Literal["disabled", "keys"] = "disabled"
    admin_api_key: SecretStr | None = None

    # Workers and sandboxes
    worker_concurrency: int = Field(default=4, ge=1, le=256)
    worker_name: str | None = None
    sandbox_image: str = "sandhive-sandbox:latest"
    sandbox_pids_limit: int = Field(default=512, ge=16)
    sandbox_workdir: str = "/testbed"

    # The default LLM profile; more named profiles may come from a TOML file
    llm_base_url: str = ""
    llm_api_key: SecretStr = SecretStr("")
    llm_model: str = ""
    llm_profiles_file: Path | None = None
    llm_timeout_s: float = Field(default=1200.0, gt=0)
    llm_max_retries: int = Field(default=3, ge=0, le=10)
    llm_retry_backoff_s: float = Field(default=1.0, ge=0)

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
    answer_max_bytes: int = Field(default=64 * 2**10, ge=1)

    def llm_profiles(self) -> dict[str, LLMProfile]:
        """Named providers: `default` from the environment, others from the TOML file."""
        profiles: dict[str, LLMProfile] = {}
        if self.llm_base_url:
            profiles["default"] = LLMProfile(
                base_url=self.llm_base_url, api_key=self.llm_api_key, model=self.llm_model
            )
        if self.llm_profiles_file is not None:
            data = tomllib.loads(self.llm_profiles_file.read_text())
            for name, table in data.get("profiles", {}).items():
                profiles[name] = LLMProfile.model_validate(table)
        return profiles
