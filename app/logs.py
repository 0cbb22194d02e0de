"""Log setup for `sandhive serve`, `sandhive worker` and `sandhive admin`: JSON lines or text.

`bind(task_id=..., attempt=..., tenant=...)` attaches those fields to every
line logged afterwards in the same asyncio task (a contextvar, so attempts
running side by side never mix them up). Every line, in both formats, goes
through `scrub`, which blanks API keys, bearer tokens, provider keys and URL
passwords. Imported by app.cli.main and app.worker; imports nothing of Sandhive.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from contextvars import ContextVar
from datetime import UTC, datetime

_fields: ContextVar[dict[str, object] | None] = ContextVar("sandhive_log_fields", default=None)

_SECRETS = (
    (re.compile(r"shv_[A-Za-z0-9_\-]+"), "shv_[redacted]"),
    (re.compile(r"(?i)(bearer\s+)[^\s\"']+"), r"\1[redacted]"),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}"), "sk-[redacted]"),
    (re.compile(r"(?i)([?&](?:token|api_key|key)=)[^&\s\"']+"), r"\1[redacted]"),
    (re.compile(r"(://[^/\s:@]*:)[^@\s/]+@"), r"\1[redacted]@"),
    (
        re.compile(r"(?i)((?:api[_-]?key|password|secret)[\"']?\s*[:=]\s*[\"']?)[^\s\"',}]+"),
        r"\1[redacted]",
    ),
)
TASK_FIELDS = ("task_id", "attempt", "tenant", "worker")


def scrub(text: str) -> str:
    """The text with every secret-looking value blanked."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def bind(**fields: object) -> None:
    """Attach fields to every later line of the current asyncio task (or thread)."""
    merged = dict(_fields.get() or {})
    merged.update({key: value for key, value in fields.items() if value is not None})
    _fields.set(merged)


def bound() -> dict[str, object]:
    """The fields bound in the current context."""
    return dict(_fields.get() or {})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the bound fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": scrub(record.getMessage()),
        }
        line.update(getattr(record, "sandhive_fields", None) or bound())
        if record.exc_info:
            line["exc"] = scrub(self.formatException(record.exc_info))
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """The classic line, with the bound fields appended and secrets blanked."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = bound()
        if fields:
            text += " " + " ".join(f"{key}={value}" for key, value in fields.items())
        return scrub(text)


def setup(fmt: str = "text", level: str = "INFO") -> None:
    """Route every logger (uvicorn's too) to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # httpx logs every request at INFO: one line per model call on the hot path (and the
    # worker's webhooks), which is what DEBUG is for.
    logging.getLogger("httpx").setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
