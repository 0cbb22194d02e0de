"""What the sync and async clients share: requests as data, answers read, retry delays.

Each API call is a `Call` (method, path, query, body, how to read the answer);
the two transports only send it, so an endpoint is written once for both.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from sandhive_client import errors

T = TypeVar("T")
RETRY_STATUSES = (429, 503)


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and the reading of its answer."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    params: Mapping[str, Any] | None = None
    json: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    content: bytes | None = None
    """A raw body (sent instead of `json`)."""
    timeout: httpx.Timeout | None = None
    """This call's own timeouts (a command that runs long); None: the client's."""
    errors_by_reason: Mapping[tuple[int, str], type[errors.APIError]] = field(default_factory=dict)
    """Finer error classes by (status, `details.reason`), e.g. a sandbox's file errors."""
    once: bool = False
    """It runs something each time it is sent (a sandbox's command): a 503, which may come
    after it ran, is not sent again; a 429 (refused before anything ran) still is."""

    def timeout_or(self, default: Any) -> Any:
        """`timeout`, or `default` (httpx's USE_CLIENT_DEFAULT) when the call has none."""
        return default if self.timeout is None else self.timeout


@dataclass(frozen=True)
class Retries:
    """Bounded retries of 429/503 (and of connections refused): never an endless loop."""

    max_retries: int = 3
    """Retries after the first try."""
    max_wait_s: float = 30.0
    """The longest one wait may be, whatever Retry-After says."""
    default_wait_s: float = 1.0
    """The wait when the server sent no Retry-After (doubled each retry)."""

    def delay(self, attempt: int, retry_after_s: float | None) -> float:
        """Seconds to wait before retry number `attempt` (from 1)."""
        base = (
            retry_after_s if retry_after_s is not None else self.default_wait_s * 2 ** (attempt - 1)
        )
        return min(max(base, 0.0), self.max_wait_s)


def headers_of(api_key: str | None, user_agent: str) -> dict[str, str]:
    headers = {"User-Agent": user_agent, "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def retry_after(response: httpx.Response) -> float | None:
    """Retry-After in seconds, given as seconds or as an HTTP date; None if absent or bad."""
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def raise_for_error(
    response: httpx.Response,
    by_reason: Mapping[tuple[int, str], type[errors.APIError]] | None = None,
) -> None:
    """The typed exception of a non-2xx answer (its body read for code, message, details);
    `by_reason` picks a finer class by (status, `details.reason`)."""
    if response.is_success:
        return
    status = response.status_code
    code, message, details = _error_body(response)
    if status in RETRY_STATUSES:
        kind = errors.RateLimited if status == 429 else errors.Unavailable
        raise kind(status, code, message, details, response, retry_after(response))
    reason = details.get("reason") if isinstance(details, dict) else None
    cls = (
        (by_reason or {}).get((status, str(reason)))
        or errors._BY_CODE.get((status, code))
        or _class_of(status)
    )
    raise cls(status, code, message, details, response)


def _class_of(status: int) -> type[errors.APIError]:
    if status in errors._BY_STATUS:
        return errors._BY_STATUS[status]
    return errors.ServerError if status >= 500 else errors.APIError


def _error_body(response: httpx.Response) -> tuple[str, str, Any]:
    try:
        error = response.json()["error"]
        return str(error["code"]), str(error["message"]), error.get("details")
    except (ValueError, KeyError, TypeError):
        text = response.text[:500] if response.text else response.reason_phrase
        return f"http_{response.status_code}", text, None


def retried(call: Call[Any], status: int) -> bool:
    """Whether an answer of `status` is worth sending `call` again for."""
    return status == 429 or (status == 503 and not call.once)


def may_resend(call: Call[Any], exc: httpx.TransportError) -> bool:
    """Whether sending `call` again after `exc` is safe: it never left (a refused
    connection), or repeating it changes nothing (a GET, or a POST with an Idempotency-Key,
    e.g. on a kept-alive connection the server closed meanwhile)."""
    if isinstance(exc, httpx.ConnectError):
        return True
    return call.method == "GET" or "Idempotency-Key" in call.headers
