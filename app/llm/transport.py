"""HTTP retry machinery shared by the model clients: failures, backoff, Retry-After, errors.

Imported by `app.llm.openai` and `app.llm.anthropic`; the wire formats stay in
their own modules, and `HTTPChatModel` holds what the two clients share (their
settings, the HTTP client's lifetime, the kept-down `max_tokens`). An attempt
yields a result or a `Failure`; `with_retries`
repeats it with backoff (or the server's Retry-After), lets the context-length
recovery lower `max_tokens` without counting it as a retry, and turns the last
failure into `LLMError`. Error texts never carry the API key or URL secrets.
"""

from __future__ import annotations

import asyncio
import email.utils
import http.cookiejar
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Required, TypedDict, TypeVar, Unpack

import httpx

from app import defaults
from app.errors import ContextOverflow, LLMError
from app.llm.recovery import MAX_RECOVERIES, is_context_error, is_overflow, next_max_tokens

MAX_BACKOFF_S = 30.0
MAX_RETRY_AFTER_S = 60.0
MAX_CONNECT_TIMEOUT_S = 30.0
EXCERPT_CHARS = 300
ERROR_BODY_CHARS = 4000

T = TypeVar("T")


def shared_http_client() -> httpx.AsyncClient:
    """One HTTP client for every task of a process (the worker's): kept-alive connections
    to the model endpoints are reused across tasks, and the TLS context (loading the CA
    bundle costs ~50 ms here) is built once, not per task. Headers and timeouts are set
    per request by the model clients; cookies are never kept, so nothing an endpoint
    sets for one task (or tenant) rides along with another's requests."""
    no_cookies = http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    return httpx.AsyncClient(cookies=no_cookies, limits=limits)


class ModelOptions(TypedDict, total=False):
    """How one task calls its model, the same for both wire formats."""

    model: Required[str]
    temperature: float | None
    """None: not sent (the server's own default)."""
    max_tokens: int | None
    extra_body: Mapping[str, Any] | None
    timeout_s: float
    max_retries: int
    backoff_s: float
    client: httpx.AsyncClient | None
    """A shared HTTP client the model uses but does not close; None: its own."""
    extra_headers: Mapping[str, str] | None
    """More headers on every request (the rollout's session header)."""
    capture: bool
    """Ask for and return token ids and logprobs (OpenAI-compatible kind only)."""


class HTTPChatModel:
    """What both chat clients share: the endpoint, limits and retries, and the HTTP client.

    Subclasses pass the URL they post to and the headers their API wants.
    """

    def __init__(
        self, *, url: str, api_key: str, headers: dict[str, str], **options: Unpack[ModelOptions]
    ) -> None:
        self.url = url
        self.model = options["model"]
        self._endpoint = Endpoint(url, api_key)
        self._headers = {**headers, **(options.get("extra_headers") or {})}
        self._temperature = options.get("temperature")
        self._max_tokens = options.get("max_tokens")
        self._extra_body = dict(options.get("extra_body") or {})
        self._timeout = request_timeout(options.get("timeout_s", defaults.LLM_TIMEOUT_S))
        self._max_retries = options.get("max_retries", defaults.LLM_MAX_RETRIES)
        self._backoff_s = options.get("backoff_s", defaults.LLM_RETRY_BACKOFF_S)
        client = options.get("client")
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient()

    async def aclose(self) -> None:
        """Close the HTTP client, but only one this model created itself."""
        if self._owns_client:
            await self._client.aclose()

    async def _post_json(self, url: str, body: dict[str, Any]) -> httpx.Response | Failure:
        """One POST of `body`: a 2xx response, or a description of what went wrong."""
        try:
            response = await self._client.post(
                url, json=body, headers=self._headers, timeout=self._timeout
            )
        except httpx.TransportError as exc:
            return transport_failure(exc)
        return response if response.is_success else self._endpoint.http_failure(response)

    async def _with_retries(
        self,
        attempt: Callable[[], Awaitable[T | Failure]],
        recover: Callable[[Failure], bool],
    ) -> tuple[T, int]:
        """`with_retries` with this model's endpoint, retries and backoff."""
        return await with_retries(
            attempt,
            endpoint=self._endpoint,
            max_retries=self._max_retries,
            backoff_s=self._backoff_s,
            recover=recover,
        )

    def _shrink_max_tokens(self, body: dict[str, Any], failure: Failure) -> bool:
        """Lower max_tokens after a context-length error; kept for later turns (input grows)."""
        smaller = smaller_max_tokens(body, failure)
        if smaller is not None:
            self._max_tokens = smaller
        return smaller is not None


def transient(status: int | None) -> bool:
    """An answer that may heal (429, 5xx), or none at all (no connection, a timeout): worth
    asking again later, unlike any other status."""
    return status is None or status == 429 or status >= 500


@dataclass(frozen=True)
class Failure:
    """Why one attempt failed, and whether another attempt may help."""

    description: str
    retryable: bool
    status: int | None = None
    retry_after_s: float | None = None
    body: str = ""
    """The start of the error body, for the context-length recovery."""


@dataclass(frozen=True)
class Endpoint:
    """Where a client posts, and the key to keep out of every error message."""

    url: str
    api_key: str

    def excerpt(self, text: str) -> str:
        """A short, key-free slice of a response body for error messages."""
        if self.api_key:
            text = text.replace(self.api_key, "***")
        return " ".join(text.split())[:EXCERPT_CHARS] or "(empty body)"

    def error(
        self, description: str, status: int | None, attempts: int, *, overflow: bool = False
    ) -> LLMError:
        """The LLMError for this endpoint, naming what failed and how often it was tried
        (`ContextOverflow` when the server refused the conversation's length)."""
        endpoint = redact_url(self.url)
        message = f"LLM endpoint {endpoint}: {description} (after {attempts} attempt(s))"
        details = {"endpoint": endpoint, "status": status, "attempts": attempts}
        return (ContextOverflow if overflow else LLMError)(message, details)

    def http_failure(self, response: httpx.Response) -> Failure:
        """A non-2xx answer: 429 and 5xx may heal, other statuses will not."""
        status = response.status_code
        return Failure(
            f"HTTP {status}: {self.excerpt(response.text)}",
            retryable=transient(status),
            status=status,
            retry_after_s=parse_retry_after(response.headers.get("retry-after")),
            body=response.text[:ERROR_BODY_CHARS],
        )


def request_timeout(timeout_s: float) -> httpx.Timeout:
    """The read timeout asked for; a dead host should not hold a slot that long to connect."""
    return httpx.Timeout(timeout_s, connect=min(timeout_s, MAX_CONNECT_TIMEOUT_S))


def transport_failure(exc: httpx.TransportError) -> Failure:
    """A timeout or an unreachable server: worth another attempt."""
    if isinstance(exc, httpx.TimeoutException):
        return Failure(f"timed out: {type(exc).__name__}", retryable=True)
    if isinstance(exc, httpx.RemoteProtocolError):
        # What a server that died while streaming leaves behind (llama-server killed mid-answer)
        return Failure(f"the server closed the connection mid-answer ({exc})", retryable=True)
    return Failure(f"unreachable: {exc!r}", retryable=True)


def smaller_max_tokens(body: dict[str, Any], failure: Failure) -> int | None:
    """After a context-length error, the lower max_tokens now set in body; else None."""
    if not is_context_error(failure.status, failure.body):
        return None
    smaller = next_max_tokens(body.get("max_tokens"), failure.body)
    if smaller is not None:
        body["max_tokens"] = smaller
    return smaller


async def with_retries(
    attempt: Callable[[], Awaitable[T | Failure]],
    *,
    endpoint: Endpoint,
    max_retries: int,
    backoff_s: float,
    recover: Callable[[Failure], bool],
) -> tuple[T, int]:
    """The first successful attempt's result and the attempt number; LLMError at last.

    `recover` may fix the request after a failure (the context-length recovery);
    when it does, the next attempt does not count toward `max_retries`.
    """
    attempts = max_retries + 1
    failed = recoveries = 0
    first: Failure | None = None
    while True:
        outcome = await attempt()
        if not isinstance(outcome, Failure):
            return outcome, failed + 1
        if recoveries < MAX_RECOVERIES and recover(outcome):
            recoveries += 1  # a context-length recovery is not a retry
            continue
        failed += 1
        first = first or outcome
        if not outcome.retryable or failed == attempts:
            overflow = is_overflow(outcome.status, outcome.body)
            raise endpoint.error(_told(first, outcome), outcome.status, failed, overflow=overflow)
        await asyncio.sleep(retry_delay(failed, backoff_s, outcome.retry_after_s))


def _told(first: Failure, last: Failure) -> str:
    """The last failure, and the first when it differs: a server that died mid-answer is
    then refused on the retry, and "unreachable" alone would hide what happened."""
    if first.description == last.description:
        return last.description
    return f"{last.description}; first attempt: {first.description}"


def retry_delay(attempt: int, backoff_s: float, retry_after_s: float | None) -> float:
    """Seconds to wait after failed attempt N: the server's wish, else exponential backoff."""
    if retry_after_s is not None:
        return min(max(retry_after_s, 0.0), MAX_RETRY_AFTER_S)
    return min(backoff_s * 2.0 ** (attempt - 1), MAX_BACKOFF_S)


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def redact_url(url: str) -> str:
    """The URL without user info or query string, safe to show in messages."""
    parsed = httpx.URL(url)
    return str(parsed.copy_with(username=None, password=None, query=None))
