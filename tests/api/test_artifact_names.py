"""Every artifact the list names can be downloaded, whatever names the agent chose.

The whole path: a scripted agent leaves files with control characters in their names in
a real sandbox, a worker collects them, and the API lists, serves and zips what it kept
(real Postgres, Redis, Docker and the scripted LLM).
"""

from __future__ import annotations

import base64
import io
import zipfile
from urllib.parse import quote

import httpx
from redis.asyncio import Redis

from app.api.app import create_app
from app.config import Settings
from app.db.engine import Sessions
from app.schemas.tasks import LLMOptions, TaskCreate
from app.scripted import Script, ScriptedLLMServer, Turn
from app.services.tasks import service as tasks
from app.worker.pool import Worker
from tests.api.conftest import serve
from tests.support.private_redis_fixtures import private_redis_url, redis, settings
from tests.support.rows import insert_artifact, insert_task

__all__ = ["private_redis_url", "redis", "settings"]

MAKE_FILES = r"""
import os
os.chdir('/testbed/output')
for name in [b'new\nline', b'cr\r\nlf', b'esc\x1b[0m', b'del\x7f', b'nel\xc2\x85', b'bad\xff']:
    open(name, 'wb').write(b'hidden')
os.mkdir(b'dir\n')
open(b'dir\n/inside.txt', 'wb').write(b'hidden')
os.mkdir('plots')
for name in ['answer.txt', 'plots/r\u00e9sum\u00e9 ?#%.txt', 'back\\slash', 'sp ace ']:
    open(name, 'w').write('kept ' + name)
"""
REFUSED = [
    "bad\\xff",
    "cr\\x0d\\x0alf",
    "del\\x7f",
    "dir\\x0a/inside.txt",
    "esc\\x1b[0m",
    "nel\\x85",
    "new\\x0aline",
]
KEPT = ["answer.txt", "back\\slash", "plots/r\u00e9sum\u00e9 ?#%.txt", "sp ace "]


def url(task_id: str, path: str) -> str:
    return f"/v1/tasks/{task_id}/artifacts/{quote(path, safe='/')}"


async def test_names_with_control_characters_are_refused_and_the_rest_all_download(
    settings: Settings, redis: Redis, sessions: Sessions, scripted_llm: ScriptedLLMServer
) -> None:
    script = base64.b64encode(MAKE_FILES.encode()).decode()
    turns = [
        Turn(tool="execute_bash", arguments={"command": f"echo {script} | base64 -d | python3"})
    ]
    scripted_llm.add_script("odd-names", Script(turns=[*turns, Turn("submit")]))
    body = TaskCreate(prompt="write files", llm=LLMOptions(model="odd-names"))
    task_id = (await tasks.submit_task(sessions, redis, settings, "default", body, None))[0].id
    await Worker(settings).run(burst=True)
    async with serve(create_app(settings)) as client:
        task = (await client.get(f"/v1/tasks/{task_id}")).json()
        listing = (await client.get(f"/v1/tasks/{task_id}/artifacts")).json()
        downloads = {
            item["path"]: await client.get(url(task_id, item["path"])) for item in listing["items"]
        }
        archive = (await client.get(f"/v1/tasks/{task_id}/artifacts.zip")).content
    assert task["status"] == "succeeded", task
    assert {path: r.status_code for path, r in downloads.items()} == dict.fromkeys(downloads, 200)
    assert [item["path"] for item in listing["items"]] == KEPT
    assert sorted(listing["skipped"], key=lambda s: s["path"]) == [
        {"path": path, "reason": "unusable file name"} for path in REFUSED
    ]
    assert listing["skipped"] == task["artifacts_skipped"]
    assert {path: (r.status_code, r.content) for path, r in downloads.items()} == {
        path: (200, f"kept {path}".encode()) for path in KEPT
    }
    with zipfile.ZipFile(io.BytesIO(archive)) as zipped:
        assert sorted(zipped.namelist()) == KEPT


async def test_a_stored_name_with_a_newline_is_still_served(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    """Collected before such names were refused: listed, so it must download too."""
    task_id = await insert_task(sessions, status="succeeded", finish_reason="submitted")
    for path in ("new\nline", "ends with\n"):
        await insert_artifact(sessions, task_id, path, path.encode(), "text/plain")
    listing = (await client.get(f"/v1/tasks/{task_id}/artifacts")).json()
    for item in listing["items"]:
        response = await client.get(url(task_id, item["path"]))
        assert (response.status_code, response.content) == (200, item["path"].encode())
        assert "\n" not in response.headers["content-disposition"]
