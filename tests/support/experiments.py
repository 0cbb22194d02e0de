"""What the experiment tests of several packages (tests/api, tests/worker) share: a small
submission, an admin key acting for a tenant, counting what was stored, an arm's progress,
waiting for an experiment to settle, a scripted model that always replies the same, and
the experiment's stored event log.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
from sqlalchemy import func, insert, select

from app.db import models
from app.db.engine import Sessions
from app.ids import utc_now
from app.scripted import Script, ScriptedLLMServer, Turn
from app.services.experiments.rows import store_rows

ADMIN_KEY = "sk-admin-experiments-0123456789abcdef"
"""The admin key of settings made with `auth="keys", admin_api_key=ADMIN_KEY`."""
STATUSES = ("pending", "running", "scoring", "scored", "error", "cancelled")
UNDER_WAY = ("pending", "running", "scoring")


def experiment(**overrides: Any) -> dict[str, Any]:
    """Three sums in two arms (`a` with 5 steps at most, `b`), math-scored, 2 at a time."""
    rows = [
        {"id": f"q{i}", "problem_statement": f"What is {i} + {i}?", "ground_truth": str(2 * i)}
        for i in range(1, 4)
    ]
    return {
        "name": "sums",
        "dataset": {"rows": rows},
        "arms": [{"name": "a", "task": {"limits": {"max_steps": 5}}}, {"name": "b"}],
        "scorer": {"kind": "math"},
        "concurrency": 2,
        **overrides,
    }


async def submit(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    """Create the experiment (a 202, or the test fails with the answer); its URL."""
    created = await client.post("/v1/experiments", json=body)
    assert created.status_code == 202, created.text
    return f"/v1/experiments/{created.json()['id']}"


def as_tenant(tenant: str) -> dict[str, str]:
    """Headers of `ADMIN_KEY` acting for `tenant`."""
    return {"Authorization": f"Bearer {ADMIN_KEY}", "X-Sandhive-Tenant": tenant}


async def counts(sessions: Sessions) -> tuple[int, int, int]:
    """How many experiments, items and tasks are stored."""
    async with sessions() as session:
        return (
            await session.scalar(select(func.count()).select_from(models.Experiment)) or 0,
            await session.scalar(select(func.count()).select_from(models.ExperimentItem)) or 0,
            await session.scalar(select(func.count()).select_from(models.Task)) or 0,
        )


def progress(**nonzero: int) -> dict[str, int]:
    """An arm's `progress` as the API gives it: every status and `not_scored`, 0 unless given."""
    return {status: nonzero.get(status, 0) for status in (*STATUSES, "not_scored")}


async def settled(
    client: httpx.AsyncClient, url: str, status: str = "finished", timeout_s: float = 240
) -> Any:
    """The experiment at `url` once it has `status` and no item is pending, running or
    scoring."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        exp = (await client.get(url)).json()
        busy = any(p[s] for p in exp["progress"].values() for s in UNDER_WAY)
        if exp["status"] == status and not busy:
            return exp
        await asyncio.sleep(0.2)
    raise AssertionError(f"{url} did not settle as {status}: {exp}")


def scripted(llm: ScriptedLLMServer, prefix: str, reply: str, delay_s: float = 0.0) -> str:
    """A no-tools model that always replies `reply` (a vanilla arm, or a judge); its name."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    llm.add_script(name, Script([Turn(content=reply, delay_s=delay_s)], tools="none"))
    return name


async def event_log(sessions: Sessions, exp_id: str) -> list[models.ExperimentEvent]:
    """The experiment's stored events, in seq order."""
    events = models.ExperimentEvent
    async with sessions() as session:
        query = select(events).where(events.experiment_id == exp_id).order_by(events.seq)
        return list(await session.scalars(query))


async def insert_one_item_experiment(
    sessions: Sessions, spec: dict[str, Any], *, prefix: str = "exp_one", **item: Any
) -> str:
    """A running experiment of `spec` with one item, row q0 of arm a, written as a crash or
    an older version could have left it (`item`: its columns besides the key); its id."""
    exp_id = f"{prefix}{uuid.uuid4().hex[:8]}"
    created = item.pop("experiment_created_at", None)
    async with sessions.begin() as session:
        session.add(
            models.Experiment(
                id=exp_id,
                tenant_id="t1",
                name=prefix,
                status="running",
                spec=spec,
                meta={},
                **({"created_at": created} if created is not None else {}),
            )
        )
        await session.flush()
        await store_rows(
            session, exp_id, [{"id": "q0", "problem_statement": "p", "ground_truth": "1"}]
        )
        await session.execute(
            insert(models.ExperimentItem).values(
                experiment_id=exp_id,
                row_id="q0",
                arm="a",
                attempt=1,
                seq=0,
                detail={},
                updated_at=utc_now(),
                **item,
            )
        )
    return exp_id


async def insert_scoring_item(
    sessions: Sessions, scorer: dict[str, Any], *, claims: int = 0
) -> str:
    """A running experiment with one answer waiting in `scoring`, claimed `claims` times
    before; its id."""
    spec = {"arms": [], "scorer": scorer, "attempts": 1, "concurrency": 1}
    return await insert_one_item_experiment(
        sessions, spec, prefix="exp_scoring", status="scoring", answer="1", scoring_claims=claims
    )
