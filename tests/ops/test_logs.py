"""JSON log lines: bound task fields stay with their own asyncio task; secrets never get out."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest

from app import logs


@pytest.fixture
def captured() -> logging.Logger:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("tests.ops.json")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.stream = stream  # type: ignore[attr-defined]
    return logger


def lines_of(logger: logging.Logger) -> list[dict]:
    text = logger.stream.getvalue()  # type: ignore[attr-defined]
    return [json.loads(line) for line in text.splitlines()]


async def test_each_attempt_logs_its_own_task_fields(captured: logging.Logger) -> None:
    async def attempt(task_id: str, n: int, tenant: str) -> None:
        logs.bind(task_id=task_id)
        await asyncio.sleep(0)
        logs.bind(attempt=n, tenant=tenant)
        await asyncio.sleep(0.01)
        captured.info("step of %s", task_id)

    await asyncio.gather(attempt("tsk_a", 1, "acme"), attempt("tsk_b", 2, "globex"))
    captured.info("not about a task")
    lines = lines_of(captured)
    by_task = {line.get("task_id"): line for line in lines}
    assert by_task["tsk_a"]["attempt"] == 1
    assert by_task["tsk_a"]["tenant"] == "acme"
    assert by_task["tsk_b"]["attempt"] == 2
    assert by_task["tsk_b"]["tenant"] == "globex"
    assert by_task["tsk_a"]["msg"] == "step of tsk_a"
    plain = lines[-1]
    assert plain["msg"] == "not about a task"
    assert "task_id" not in plain
    assert {"ts", "level", "logger"} <= set(plain)


SECRETS = [
    ("shv_k1234567890abcdef_s3cr3tpart", "s3cr3tpart"),
    ("Authorization: Bearer abc.def-ghi", "abc.def-ghi"),
    ("key sk-ant-api03-verysecretvalue", "verysecretvalue"),
    ("GET /v1/tasks/x/stream?token=tok_hidden_1&after=0", "tok_hidden_1"),
    ("redis://api:hunter2pass@redis:6379/0", "hunter2pass"),
    ("postgresql+asyncpg://sandhive:pgpass99@db/sandhive", "pgpass99"),
    ('{"api_key": "plainkey77"}', "plainkey77"),
]


@pytest.mark.parametrize(("message", "secret"), SECRETS)
def test_secrets_never_reach_a_line(captured: logging.Logger, message: str, secret: str) -> None:
    captured.warning("failed: %s", message)
    try:
        raise RuntimeError(message)
    except RuntimeError:
        captured.exception("crashed")
    text = captured.stream.getvalue()  # type: ignore[attr-defined]
    assert secret not in text
    assert "[redacted]" in text


def test_text_format_scrubs_and_carries_fields() -> None:
    record = logging.LogRecord(
        "x", logging.INFO, __file__, 1, "url %s", ("redis://u:pw123@h/0",), None
    )
    logs.bind(task_id="tsk_text")
    text = logs.TextFormatter().format(record)
    assert "pw123" not in text
    assert "task_id=tsk_text" in text
