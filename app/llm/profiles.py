"""From a server-side provider profile to the model client that speaks its wire format.

Imported by `app.runner.episode` (worker and `sandhive run`). A profile's `kind` picks
the client; the key comes from the profile, never from the task.
"""

from __future__ import annotations

from typing import Unpack

from app.config import LLMProfile
from app.llm.anthropic import AnthropicChatModel
from app.llm.openai import OpenAIChatModel
from app.llm.token_continuous import TokenContinuousModel
from app.llm.transport import ModelOptions

HTTPChatModel = OpenAIChatModel | AnthropicChatModel | TokenContinuousModel
"""A `ChatModel` that owns an HTTP client: close it with `aclose()`."""


def model_for_profile(
    profile: LLMProfile, *, continuous: bool = False, **options: Unpack[ModelOptions]
) -> HTTPChatModel:
    """The client for this profile's kind, configured for one task; `continuous`: the
    token-continuous client of an OpenAI-compatible server (its completions endpoint)."""
    api_key = profile.api_key.get_secret_value()
    if continuous and profile.kind == "openai":
        return TokenContinuousModel(base_url=profile.base_url, api_key=api_key, **options)
    if profile.kind == "anthropic":
        return AnthropicChatModel(base_url=profile.base_url, api_key=api_key, **options)
    return OpenAIChatModel(
        base_url=profile.base_url, api_key=api_key, stream=profile.stream, **options
    )
