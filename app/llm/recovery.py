"""Context-length recovery: shrink `max_tokens` when the prompt plus the answer will not fit.

Imported by the model clients (`app.llm.openai`, `app.llm.anthropic`). The rule is
the reference package's (REFERENCE.md §1.3 step 4): an error that names the
context limit X and the input size Y lowers `max_tokens` to X - Y - 100 when that
is at least 8192, else the call fails; an error that mentions the limit without
both numbers halves `max_tokens`, never below 8192. Recoveries are not retries:
they do not count toward the retry limit (but are bounded, see MAX_RECOVERIES).
"""

from __future__ import annotations

import re

MIN_MAX_TOKENS = 8192
"""The reference's floor: below this the answer would be too short to be useful."""
SAFETY_TOKENS = 100
MAX_RECOVERIES = 8
"""Each recovery lowers max_tokens, so this only guards against a server that lies."""

_LIMIT_AND_INPUT = (
    # SGLang, and the reference's own pattern
    re.compile(r"maximum context length of (\d+) tokens.*?(\d+) tokens from the input", re.S),
    # OpenAI and older vLLM: "... is X tokens. However, you requested Z tokens (Y in the messages"
    re.compile(r"maximum context length is (\d+) tokens.*?\((\d+) in the messages", re.S),
    # newer vLLM: "... is X tokens and your request has Y input tokens"
    re.compile(r"maximum context length is (\d+) tokens.*?(\d+) input tokens", re.S),
)
# llama.cpp: "request (9521 tokens) exceeds the available context size (8192 tokens)"
_INPUT_THEN_LIMIT = re.compile(
    r"request \((\d+) tokens\) exceeds the available context size \((\d+)"
)
# Anthropic: "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000"
_INPUT_PLUS_OUTPUT = re.compile(r"(\d+) \+ (\d+) > (\d+)")


def is_context_error(status: int | None, text: str) -> bool:
    """The reference's test ("token" with "exceed"/"limit"/"maximum"), never for a 429.

    A rate limit often says "tokens per minute ... limit": that is a wait, not a shrink.
    """
    if status == 429:
        return False
    lowered = text.lower()
    return "token" in lowered and any(w in lowered for w in ("exceed", "limit", "maximum"))


PROMPT_TOO_LONG = re.compile(
    r"prompt is too long|input is too long|exceeds the available context size", re.IGNORECASE
)
"""Texts that say the conversation itself does not fit (Anthropic, others, llama.cpp)."""


def is_overflow(status: int | None, text: str) -> bool:
    """The conversation itself is longer than the model's window: its budget used up, not a
    setting to fix. Only an unambiguous refusal (a 400/413/422 that says the prompt is too
    long, or names an input at least as large as the window): a `max_tokens` over what the
    model allows, or a tokens-per-minute quota, is not."""
    if status not in (400, 413, 422) or not is_context_error(status, text):
        return False
    if PROMPT_TOO_LONG.search(text):
        return True
    limits = parse_limits(text)
    return limits is not None and limits[1] >= limits[0]


def parse_limits(text: str) -> tuple[int, int] | None:
    """(context limit, input tokens) named by the error, or None."""
    for pattern in _LIMIT_AND_INPUT:
        if match := pattern.search(text):
            return int(match.group(1)), int(match.group(2))
    if match := _INPUT_THEN_LIMIT.search(text):
        return int(match.group(2)), int(match.group(1))
    if match := _INPUT_PLUS_OUTPUT.search(text):
        return int(match.group(3)), int(match.group(1))
    return None


def next_max_tokens(current: int | None, text: str) -> int | None:
    """The smaller max_tokens to try next, or None when there is nothing sensible left."""
    limits = parse_limits(text)
    if limits is not None:
        limit, used = limits
        wanted = limit - used - SAFETY_TOKENS
        if wanted < MIN_MAX_TOKENS or (current is not None and wanted >= current):
            return None
        return wanted
    if current is None:
        return None
    halved = max(current // 2, MIN_MAX_TOKENS)
    return halved if halved < current else None
