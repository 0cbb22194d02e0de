"""Reading a task's artifacts back: the list, one file, or all of them as a zip.

Imported by the API. The worker stores artifacts (`services.attempts`); here
every read goes through the tenant's task first, so another tenant's files
are not found (invariant 6).
"""

from __future__ import annotations

import asyncio
import io
import zipfile

from sqlalchemy import select

from app.db.engine import Sessions
from app.db.models import Artifact
from app.errors import NotFound
from app.schemas.tasks import ArtifactList, ArtifactOut
from app.services.tasks.service import skipped_of
from app.services.visibility import find_task


async def list_artifacts(sessions: Sessions, tenant: str, task_id: str) -> ArtifactList:
    """Metadata only, ordered by path; the bytes stay in Postgres."""
    query = (
        select(Artifact.path, Artifact.size, Artifact.content_type, Artifact.sha256)
        .where(Artifact.task_id == task_id)
        .order_by(Artifact.path)
    )
    async with sessions() as session:
        task = await find_task(session, tenant, task_id)
        rows = (await session.execute(query)).all()
    return ArtifactList(
        items=[
            ArtifactOut(path=path, size=size, content_type=content_type, sha256=sha256)
            for path, size, content_type, sha256 in rows
        ],
        skipped=skipped_of(task),
    )


async def read_artifact(
    sessions: Sessions, tenant: str, task_id: str, path: str
) -> tuple[ArtifactOut, bytes]:
    async with sessions() as session:
        await find_task(session, tenant, task_id)
        row = await session.scalar(
            select(Artifact).where(Artifact.task_id == task_id, Artifact.path == path)
        )
    if row is None:
        raise NotFound(f"no artifact {path!r} in task {task_id}")
    return artifact_out(row), row.content


async def zip_artifacts(sessions: Sessions, tenant: str, task_id: str) -> bytes:
    """Every artifact of the task in one zip (empty zip when there are none)."""
    query = select(Artifact.path, Artifact.content).where(Artifact.task_id == task_id)
    async with sessions() as session:
        await find_task(session, tenant, task_id)
        files = [(path, content) for path, content in (await session.execute(query)).all()]
    return await asyncio.to_thread(_build_zip, sorted(files))


def _build_zip(files: list[tuple[str, bytes]]) -> bytes:
    """Blocking: runs in a thread so compressing never stalls the event loop."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, content in files:
            archive.writestr(path, content)
    return buffer.getvalue()


def artifact_out(row: Artifact) -> ArtifactOut:
    return ArtifactOut(
        path=row.path, size=row.size, content_type=row.content_type, sha256=row.sha256
    )
