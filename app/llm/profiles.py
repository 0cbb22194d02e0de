"""From a server-side provider profile to the model client that speaks its wire format.

Imported by `app.episode` (worker and `sandhive run`). A profile's `kind` picks
the client; the key comes from the profile, never from the task.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from app.config import LLMProfile
from app.llm.anthropic import AnthropicChatModel
from app.llm.openai import OpenAIChatModel

HTTPChatModel = OpenAIChatModel | AnthropicChatModel
"""A `ChatModel` that owns an HTTP client: close it with `aclose()`."""


def model_for_profile(
    profile: LLMProfile,
    *,
    model: str,
    temperature: float | None,
    max_tokens: int,
    extra_body: Mapping[str, Any] | None = None,
    timeout_s: float = 1200.0,
    max_retries: int = 3,
    backoff_s: float = 1.0,
    client: httpx.AsyncClient | None = None,
) -> HTTPChatModel:
    """The client for this profile's kind, configured for one task.

    `client`: a shared HTTP client (`transport.shared_http_client`) the model uses but
    does not close; None: the model makes (and closes) its own.
    """
    options: dict[str, Any] = {
        "base_url": profile.base_url,
        "api_key": profile.api_key.get_secret_value(),
        "model": model,
        "temperature": temperature,
        "max_tokens": max_tokens,
        "extra_body": extra_body,
        "timeout_s": timeout_s,
        "max_retries": max_retries,
        "backoff_s": backoff_s,
        "client": client,
    }
    if profile.kind == "anthropic":
        return AnthropicChatModel(**options)
    return OpenAIChatModel(**options)
