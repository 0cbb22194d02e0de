"""Test data written straight to Postgres."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from app.db import models
from app.db.engine import Sessions
from app.ids import new_task_id, utc_now
from app.specs import LimitsSpec, LLMSpec, SandboxSpec, TaskSpec, ToolsSpec

SPEC = TaskSpec(
    llm=LLMSpec(profile="default", model="m", temperature=1.0, max_tokens_per_call=100),
    limits=LimitsSpec(max_steps=5, timeout_s=60, command_timeout_s=10, max_context_tokens=4096),
    sandbox=SandboxSpec(image="img", network="none", cpus=1.0, memory_mb=256),
    tools=ToolsSpec(profile="standard", answer_all_tool_calls=True),
    prompt_config="general",
)


async def insert_task(
    sessions: Sessions,
    *,
    tenant: str = "default",
    status: str = "queued",
    created_at: datetime | None = None,
    **fields: Any,
) -> str:
    task_id = new_task_id()
    values: dict[str, Any] = {
        "prompt": "do it",
        "spec": SPEC.model_dump(mode="json"),
        "meta": {},
        "attempt": 0,
        "usage": {},
        "last_seq": 0,
        **fields,
    }
    row = models.Task(
        id=task_id, tenant_id=tenant, status=status, created_at=created_at or utc_now(), **values
    )
    async with sessions.begin() as session:
        session.add(row)
    return task_id


async def insert_tasks(sessions: Sessions, count: int, **fields: Any) -> list[str]:
    """`count` tasks one second apart, oldest first."""
    start = utc_now() - timedelta(hours=1)
    return [
        await insert_task(sessions, created_at=start + timedelta(seconds=i), **fields)
        for i in range(count)
    ]


async def insert_step(sessions: Sessions, task_id: str, attempt: int, index: int) -> None:
    async with sessions.begin() as session:
        session.add(
            models.Step(
                task_id=task_id,
                attempt=attempt,
                index=index,
                thought=f"thought {attempt}.{index}",
                reasoning="",
                action={"tool": "execute_bash", "arguments": {"command": f"echo {index}"}},
                observation=f"{index}\n",
                exit_code=0,
                started_at=utc_now(),
                llm_ms=5,
                tool_ms=7,
                prompt_tokens=11,
                completion_tokens=3,
            )
        )


async def insert_artifact(
    sessions: Sessions, task_id: str, path: str, content: bytes, content_type: str
) -> None:
    async with sessions.begin() as session:
        session.add(
            models.Artifact(
                task_id=task_id,
                path=path,
                size=len(content),
                content_type=content_type,
                sha256=hashlib.sha256(content).hexdigest(),
                content=content,
            )
        )
