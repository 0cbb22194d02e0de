"""`create_app(settings)`: the FastAPI application, its lifespan, routers and error handlers.

The lifespan opens the process's `Resources` and hands them to every request
through lifespan state; nothing lives in module globals.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app import __version__
from app.api import (
    docs,
    episodes,
    errors,
    images,
    limits,
    llm,
    metrics,
    middleware,
    openapi,
    ops,
    page,
    rollouts,
    sandboxes,
    streaming,
    webhooks,
)
from app.api.deps import open_api_resources
from app.api.experiments import routes as experiments
from app.api.experiments import stream as experiment_stream
from app.api.openenv import routes as openenv
from app.api.tasks import artifacts, files, stream
from app.api.tasks import routes as tasks
from app.config import Settings

log = logging.getLogger(__name__)
ROUTERS: tuple[APIRouter, ...] = (
    ops.router,
    metrics.router,
    tasks.router,
    experiments.router,
    episodes.router,
    openenv.router,
    sandboxes.router,
    artifacts.router,
    files.router,
    stream.router,
    experiment_stream.router,
    llm.router,
    images.router,
    webhooks.router,
    limits.router,
    rollouts.router,
    page.router,
    docs.router,
)


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[dict[str, object]]:
        async with open_api_resources(settings) as res, stream.open_hub(res) as hub:
            yield {"res": res, "hub": hub, streaming.STOPPING: asyncio.Event()}

    # /docs is app.api.docs (Swagger UI served locally); no ReDoc (it needs a CDN)
    app = FastAPI(
        title="Sandhive", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None
    )
    errors.install(app, settings)
    middleware.install(app, settings)  # body limits, origins, NUL in URLs, token redaction
    openapi.install(app, settings, ROUTERS)  # its key scheme and limits, in /openapi.json
    if settings.e2b_api:
        _install_e2b(app)
    for router in ROUTERS:
        app.include_router(router)
    return app


def _install_e2b(app: FastAPI) -> None:
    """The E2B API under `/e2b`, built on its first request: the `e2b` package it serves
    with takes seconds of CPU to import, which a server that no E2B client calls (and
    every process of the test suite) should not pay."""
    app.mount("/e2b", LazyE2B())


class LazyE2B:
    """An ASGI app that imports and builds the E2B API when first called; a 501 in E2B's
    shape where the `e2b` extra is not installed."""

    def __init__(self) -> None:
        self._app: ASGIApp | None = None
        self._missing: str | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None and self._missing is None:
            try:
                from app.api.e2b import control, envd  # the optional extra's import
            except ImportError as exc:
                log.warning("the E2B API is off: %s (pip install 'sandhive[e2b]')", exc)
                self._missing = f"the E2B API needs the e2b extra on this server: {exc}"
            else:
                inner = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
                inner.mount("/envd", envd.Envd())  # before the control plane's catch-all
                inner.include_router(control.router)
                self._app = inner
        if self._app is None:
            if scope["type"] == "http":
                body = {"code": 501, "message": self._missing}
                await JSONResponse(body, status_code=501)(scope, receive, send)
            return
        await self._app(scope, receive, send)
