"""Artifact routes: list, one file with safe headers, the zip; tenant isolation."""

from __future__ import annotations

import hashlib
import io
import zipfile

import httpx
import pytest

from app.db.engine import Sessions
from tests.api.conftest import assert_error
from tests.support.rows import insert_artifact, insert_task

FILES = [
    ("answer.txt", b"4862\n", "text/plain"),
    ("plots/catalan.png", b"\x89PNG\r\n\x1a\nfake", "image/png"),
    ("report.html", b"<script>alert(1)</script>", "text/html"),
    ("figure.svg", b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image/svg+xml"),
    ('r\u00e9sum\u00e9 "q".csv', b"a,b\n", "text/csv; charset=utf-8"),
]


@pytest.fixture
async def task_id(sessions: Sessions) -> str:
    task_id = await insert_task(sessions, status="succeeded", finish_reason="submitted")
    for path, content, content_type in FILES:
        await insert_artifact(sessions, task_id, path, content, content_type)
    return task_id


async def test_list_gives_metadata_sorted_by_path(client: httpx.AsyncClient, task_id: str) -> None:
    response = await client.get(f"/v1/tasks/{task_id}/artifacts")
    assert response.status_code == 200
    expected = [
        {
            "path": path,
            "size": len(content),
            "content_type": content_type,
            "sha256": hashlib.sha256(content).hexdigest(),
        }
        for path, content, content_type in sorted(FILES)
    ]
    assert response.json() == {"items": expected, "skipped": []}


@pytest.mark.parametrize(("path", "content", "content_type"), FILES)
async def test_each_file_is_served_untrusted_with_its_type(
    client: httpx.AsyncClient, task_id: str, path: str, content: bytes, content_type: str
) -> None:
    response = await client.get(f"/v1/tasks/{task_id}/artifacts/{path}")
    assert response.status_code == 200
    assert response.content == content
    assert response.headers["content-type"] == content_type
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["content-security-policy"] == "sandbox"
    active = path.endswith((".html", ".svg"))
    disposition = response.headers["content-disposition"]
    assert disposition.startswith("attachment;" if active else "inline;")
    assert "\n" not in disposition


async def test_a_non_ascii_name_survives_in_the_disposition(
    client: httpx.AsyncClient, task_id: str
) -> None:
    response = await client.get(f'/v1/tasks/{task_id}/artifacts/r\u00e9sum\u00e9 "q".csv')
    disposition = response.headers["content-disposition"]
    assert "filename*=UTF-8''r%C3%A9sum%C3%A9%20%22q%22.csv" in disposition
    assert 'filename="r_sum_ _q_.csv"' in disposition


async def test_the_zip_holds_every_file(client: httpx.AsyncClient, task_id: str) -> None:
    response = await client.get(f"/v1/tasks/{task_id}/artifacts.zip")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/zip"
    assert response.headers["content-disposition"].startswith("attachment;")
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        assert {name: archive.read(name) for name in archive.namelist()} == {
            path: content for path, content, _ in FILES
        }


async def test_a_task_without_artifacts(client: httpx.AsyncClient, sessions: Sessions) -> None:
    task_id = await insert_task(sessions)
    listing = (await client.get(f"/v1/tasks/{task_id}/artifacts")).json()
    assert listing == {"items": [], "skipped": []}
    response = await client.get(f"/v1/tasks/{task_id}/artifacts.zip")
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        assert archive.namelist() == []


async def test_an_unknown_artifact_is_404(client: httpx.AsyncClient, task_id: str) -> None:
    response = await client.get(f"/v1/tasks/{task_id}/artifacts/plots/missing.png")
    assert_error(response, 404, "not_found")


@pytest.mark.parametrize("suffix", ["/artifacts", "/artifacts.zip", "/artifacts/answer.txt"])
async def test_another_tenants_artifacts_are_404(
    client: httpx.AsyncClient, sessions: Sessions, suffix: str
) -> None:
    theirs = await insert_task(sessions, tenant="other")
    await insert_artifact(sessions, theirs, "answer.txt", b"secret", "text/plain")
    response = await client.get(f"/v1/tasks/{theirs}{suffix}")
    assert_error(response, 404, "not_found")
    assert "secret" not in response.text
