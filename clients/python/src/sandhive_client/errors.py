"""Typed exceptions for the API's error shape `{"error": {"code", "message", "details"}}`.

A caller branches on the class (or `code`), never on message text; `details` is
what the server said in full, e.g. the located problems of a 422.
"""

from __future__ import annotations

from typing import Any

import httpx


class SandhiveError(Exception):
    """Any failure of a call: the server's answer, or no answer at all."""


class APIError(SandhiveError):
    """The server answered with an error (non-2xx) in the contract's shape."""

    def __init__(
        self, status: int, code: str, message: str, details: Any, response: httpx.Response
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.response = response


class BadRequest(APIError):
    """400: the request could not be read."""


class Unauthorized(APIError):
    """401: no API key, or not a valid one."""


class NotFound(APIError):
    """404: no such task or experiment for this tenant."""


class Conflict(APIError):
    """409: not possible in the current state (e.g. cancelling a finished task)."""


class TooLarge(APIError):
    """413: a body, file or input over the server's size limits."""


class InvalidInput(APIError):
    """422: the request is not valid; `details` locates each problem (`loc`, `msg`, `type`)."""


class RetryableError(APIError):
    """Refused for now; `retry_after_s` is the server's Retry-After (None if it sent none)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: Any,
        response: httpx.Response,
        retry_after_s: float | None,
    ) -> None:
        super().__init__(status, code, message, details, response)
        self.retry_after_s = retry_after_s


class RateLimited(RetryableError):
    """429: over the request rate, a queue limit or the stream cap."""


class Unavailable(RetryableError):
    """503: a backend the server needs is down; nothing was done."""


class ServerError(APIError):
    """Any other 5xx."""


class ConnectionFailed(SandhiveError):
    """The server could not be reached, or the connection broke before an answer."""


class WaitTimeout(SandhiveError):
    """`tasks.wait` gave up before the task finished."""


class WebhookVerificationError(SandhiveError):
    """A webhook whose signature does not prove it came from Sandhive, recently."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: InvalidInput,
}
