"""`GET /docs`: Swagger UI on `/openapi.json`, with no request to any other host.

FastAPI's own docs page loads Swagger UI from a CDN, so it is blank offline and would
need a looser Content-Security-Policy than the page's. Here the page is a static shell,
its script and stylesheet are the vendored swagger-ui-dist files
(app/web/vendor/swagger-ui/, their version and licence in its README) and its start-up
code is `app/web/docs.js`, all under `/docs/assets/`. ReDoc is not served.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse

from app.errors import NotFound

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
ASSET_PREFIX = "/docs/assets"
ASSETS = {
    "swagger-ui-bundle.js": ("vendor/swagger-ui/swagger-ui-bundle.js", "text/javascript"),
    "swagger-ui.css": ("vendor/swagger-ui/swagger-ui.css", "text/css"),
    "favicon-32x32.png": ("vendor/swagger-ui/favicon-32x32.png", "image/png"),
    "docs.js": ("docs.js", "text/javascript"),
}
"""Name under /docs/assets/ -> (file under app/web/, media type); nothing else is reachable."""
# Swagger UI styles elements inline and draws its icons as data: URLs; "Try it out" calls
# this origin only, and shows image responses as blob: URLs.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sandhive API</title>
<link rel="icon" type="image/png" href="{assets}/favicon-32x32.png">
<link rel="stylesheet" href="{assets}/swagger-ui.css">
</head>
<body>
<div id="swagger-ui" data-openapi-url="{openapi}"></div>
<script src="{assets}/swagger-ui-bundle.js"></script>
<script src="{assets}/docs.js"></script>
</body>
</html>
"""

router = APIRouter(include_in_schema=False)


@router.get("/docs")
async def docs(request: Request) -> HTMLResponse:
    """The API's interactive reference."""
    root = request.scope.get("root_path", "").rstrip("/")
    html = _PAGE.format(assets=escape(root + ASSET_PREFIX), openapi=escape(root + "/openapi.json"))
    return HTMLResponse(html, headers={**HEADERS, "Cache-Control": "no-cache"})


@router.get(ASSET_PREFIX + "/{name}")
async def asset(name: str) -> FileResponse:
    """One of the docs page's files."""
    found = ASSETS.get(name)
    if found is None:
        raise NotFound(f"no docs asset {name!r}")
    path, media_type = found
    charset = "" if media_type.startswith("image/") else "; charset=utf-8"
    return FileResponse(WEB_DIR / path, media_type=media_type + charset, headers=HEADERS)
