"""Schemathesis hooks (SCHEMATHESIS_HOOKS): every error answer has the contract's shape."""

from __future__ import annotations

import json
from typing import Any

import schemathesis


@schemathesis.check
def error_shape(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx/5xx body is exactly {"error": {"code", "message", "details"}}."""
    if response.status_code < 400:
        return None
    try:
        body = json.loads(response.content)
    except ValueError as exc:
        raise AssertionError(
            f"error {response.status_code} is not JSON: {response.content[:200]!r}"
        ) from exc
    if not isinstance(body, dict) or set(body) != {"error"}:
        raise AssertionError(f"error body is not {{'error': ...}}: {body!r:.200}")
    error = body["error"]
    if not isinstance(error, dict) or set(error) != {"code", "message", "details"}:
        raise AssertionError(f"error object keys are {sorted(error)!r}")
    if not isinstance(error["code"], str) or not isinstance(error["message"], str):
        raise AssertionError("error code and message must be strings")
    if "Traceback" in response.text:
        raise AssertionError("a stack trace in an error body")
    return True
