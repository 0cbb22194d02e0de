"""Typed exceptions for the API's error shape `{"error": {"code", "message", "details"}}`.

A caller branches on the class (or `code`), never on message text; `details` is
what the server said in full, e.g. the located problems of a 422.
"""

from __future__ import annotations

import errno
from typing import Any, ClassVar

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


class Forbidden(APIError):
    """403: the server understood and refuses it (e.g. a sandbox's file system said no)."""


class NotFound(APIError):
    """404: no such task, experiment or sandbox for this tenant."""


class Conflict(APIError):
    """409: not possible in the current state (e.g. cancelling a finished task)."""


class TooLarge(APIError):
    """413: a body, file or input over the server's size limits."""


class InvalidInput(APIError):
    """422: the request is not valid; `details` locates each problem (`loc`, `msg`, `type`)."""


class SandboxFileError(APIError):
    """A file operation in a sandbox was refused; `path` is the path it was about.

    Each subclass is also the `OSError` Python raises for the same problem on a local file
    (`except FileNotFoundError` works), with `errno` and `filename` set; the message names
    the path.
    """

    errno_value: ClassVar[int] = errno.EIO
    errno: int | None  # as OSError's
    strerror: str | None

    def __init__(
        self, status: int, code: str, message: str, details: Any, response: httpx.Response
    ) -> None:
        path = details.get("path") if isinstance(details, dict) else None
        path = str(path) if path is not None else None
        if path is not None and path not in message:
            message = f"{message} ({path})"
        super().__init__(status, code, message, details, response)
        self.path = path
        self.errno = self.errno_value
        self.strerror = message
        self.filename = path

    def __str__(self) -> str:
        return str(self.args[0])  # APIError's "status code: message", not OSError's format


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


class SandboxFileNotFound(SandboxFileError, NotFound, FileNotFoundError):
    """404 `missing`: no such file (or directory) in the sandbox."""

    errno_value = errno.ENOENT


class SandboxIsADirectory(SandboxFileError, InvalidInput, IsADirectoryError):
    """422 `is_directory`: a directory where a file was meant (a read, or a write onto it)."""

    errno_value = errno.EISDIR


class SandboxPermissionError(SandboxFileError, Forbidden, PermissionError):
    """403 `forbidden`: the sandbox's file system refused (a mode, a read-only mount)."""

    errno_value = errno.EACCES


class SandboxFileTooLarge(SandboxFileError, TooLarge):
    """413 `too_large`: a file (or a body) over the server's file size limit."""

    errno_value = errno.EFBIG


class ImageBuildFailed(InvalidInput):
    """422 `build_failed`: Docker could not build the image (`images.build`); `message` names
    the step that failed, `log` is the end of the build's output and `name` the image's."""

    def __init__(
        self, status: int, code: str, message: str, details: Any, response: httpx.Response
    ) -> None:
        super().__init__(status, code, message, details, response)
        found = details if isinstance(details, dict) else {}
        self.name = str(found.get("name") or "")
        self.log = str(found.get("log") or "")


class CommandStreamError(SandhiveError):
    """A streamed command's stream ended with the server's `error` event: something broke
    after the command was sent (e.g. its worker was lost, `code` `unavailable`), so it may
    have run in part (`Sandbox.commands()` says what the log kept)."""

    def __init__(self, sandbox_id: str, code: str, message: str, details: Any) -> None:
        super().__init__(f"the command stream of {sandbox_id} broke off: {code}: {message}")
        self.sandbox_id = sandbox_id
        self.code = code
        self.message = message
        self.details = details


class ConnectionFailed(SandhiveError):
    """The server could not be reached, or the connection broke before an answer."""


class WaitTimeout(SandhiveError):
    """`tasks.wait` gave up before the task finished."""


class WebhookVerificationError(SandhiveError):
    """A webhook whose signature does not prove it came from Sandhive, recently."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: InvalidInput,
}

_BY_CODE: dict[tuple[int, str], type[APIError]] = {
    (422, "build_failed"): ImageBuildFailed,
}
"""Finer classes by (status, `code`), whatever the route."""

FILE_ERRORS: dict[tuple[int, str], type[APIError]] = {
    (404, "missing"): SandboxFileNotFound,
    (422, "is_directory"): SandboxIsADirectory,
    (403, "forbidden"): SandboxPermissionError,
    (413, "too_large"): SandboxFileTooLarge,
}
"""The errors of a sandbox's file routes by (status, `details.reason`)."""
