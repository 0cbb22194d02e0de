"""The browser page: `GET /` and its static files from `app/web/`, with no build step.

The page is plain HTML, CSS and its own scripts (the task view, the Experiments
view, the Sandboxes view, and Chart.js vendored for its plots) that talk to the
public `/v1` API like any other client. It is served with a strict
Content-Security-Policy (its own scripts only, no inline script) and it inserts
model output and sandbox commands only as text.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from app.errors import NotFound

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "experiments.js": "text/javascript; charset=utf-8",
    "task_view.js": "text/javascript; charset=utf-8",
    "task_files.js": "text/javascript; charset=utf-8",
    "task_fork.js": "text/javascript; charset=utf-8",
    "task_list.js": "text/javascript; charset=utf-8",
    "compare.js": "text/javascript; charset=utf-8",
    "sandboxes.js": "text/javascript; charset=utf-8",
    "chart.umd.min.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "experiments.css": "text/css; charset=utf-8",
    "task_view.css": "text/css; charset=utf-8",
    "task_list.css": "text/css; charset=utf-8",
    "sandboxes.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
VENDORED = {"chart.umd.min.js": "vendor/chart.umd.min.js"}
"""Third-party files, kept apart with their licences (app/web/vendor/README.md)."""
# Artifact previews (srcdoc frames) inherit this policy: their scripts never run,
# their inline styles may.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' blob: data:; media-src 'self' blob:; frame-src 'self' blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@router.get("/")
async def index() -> FileResponse:
    """The page: submit a task, watch it live, browse its artifacts."""
    return FileResponse(
        WEB_DIR / "index.html", media_type="text/html; charset=utf-8", headers=HEADERS
    )


@router.get("/static/{name}")
async def asset(name: str) -> FileResponse:
    """One of the page's own files; nothing else under app/web is reachable."""
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFound(f"no static file {name!r}")
    path = WEB_DIR / VENDORED.get(name, name)
    return FileResponse(path, media_type=media_type, headers=HEADERS)
