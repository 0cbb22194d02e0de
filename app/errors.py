"""The error tree of Sandhive: every failure that crosses a module boundary.

Stdlib only, importable from anywhere. The API renders any `AppError` as the
contract's `{"error": {code, message, details}}` body with `status`; drivers
(Docker, LLM) translate their library errors into these at their boundary.
"""

from __future__ import annotations


class AppError(Exception):
    """Base of all domain errors; carries an HTTP status and a machine code."""

    status = 500
    code = "internal"

    def __init__(self, message: str, details: object = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def headers(self) -> dict[str, str]:
        """Response headers that come with this error (Retry-After, for one)."""
        return {}


class InvalidInput(AppError):
    status, code = 422, "invalid_input"


class IdempotencyKeyReused(InvalidInput):
    """An Idempotency-Key sent again with a different submission: a retry must repeat it."""

    code = "idempotency_key_reused"


class BuildFailed(InvalidInput):
    """A tenant's Dockerfile did not build (a step failed, or it took too long)."""

    code = "build_failed"


class UnsupportedMediaType(AppError):
    """The body's content type is not one the route takes."""

    status, code = 415, "unsupported_media_type"


class NotFound(AppError):
    status, code = 404, "not_found"


class Conflict(AppError):
    status, code = 409, "conflict"


class ReplayDiverged(Conflict):
    """A fork's replay of a recorded step observed something else (`app.runner.replay`)."""

    code = "replay_diverged"


class TooLarge(AppError):
    status, code = 413, "too_large"


class Forbidden(AppError):
    """The target refuses the operation itself (a file the sandbox may not write)."""

    status, code = 403, "forbidden"


class ImageBuildsDisabled(Forbidden):
    """The operator has not let tenants build images (`SANDHIVE_IMAGE_BUILDS`)."""

    code = "image_builds_disabled"


class InsufficientStorage(AppError):
    """The target has no room left for what was sent (a sandbox's full disk)."""

    status, code = 507, "insufficient_storage"


class RetryLater(AppError):
    """Refused for now: the client should repeat the call after `retry_after_s` (Retry-After)."""

    def __init__(self, message: str, retry_after_s: int, details: object = None) -> None:
        super().__init__(message, details)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class TooManyRequests(RetryLater):
    """Over a limit."""

    status, code = 429, "too_many_requests"


class Unauthorized(AppError):
    status, code = 401, "unauthorized"


class NotReady(AppError):
    status, code = 503, "not_ready"


class Unavailable(RetryLater):
    """A backend the call needs is unreachable: nothing was done (nothing stored); retry."""

    status, code = 503, "unavailable"


class NoWorkerForImage(Unavailable):
    """A task of an image no live worker has: refused when the operator asks for it
    (`SANDHIVE_REFUSE_TASKS_WITHOUT_IMAGE_WORKER`); nothing was stored."""

    code = "no_worker_for_image"


class WorkerTimeout(AppError):
    """A live worker was asked and did not answer in time; what it was asked may still happen."""

    status, code = 504, "worker_timeout"


class DatabaseUnavailable(Unavailable):
    status, code = 503, "database_unavailable"


class RedisUnavailable(Unavailable):
    status, code = 503, "redis_unavailable"


class SandboxError(AppError):
    """The sandbox could not be created, reached or read."""

    status, code = 502, "sandbox_error"


class LLMError(AppError):
    """The model endpoint failed after the allowed retries."""

    status, code = 502, "llm_error"


class ContextOverflow(LLMError):
    """The model's server refused the conversation as longer than its context window, with
    no smaller `max_tokens` left to fit: the model's budget used up (the task ends
    `context_limit`, as over its own `max_context_tokens`), not the service failing."""

    code = "context_limit"


class NotInstalled(AppError):
    """This server lacks the optional package the request needs (its message names the
    extra to install)."""

    status, code = 501, "not_installed"


class ConfigError(AppError):
    """The server's configuration cannot serve this request (e.g. unknown LLM profile)."""

    status, code = 422, "config_error"
