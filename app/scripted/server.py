"""The scripted model server: both faces in one ASGI app, run by uvicorn in a thread.

`ScriptedLLMServer` is what the tests, `bench/` and `sandhive demo` start: a
real HTTP server on a local port (`base_url` is `http://HOST:PORT/v1`) whose
`ScriptBook` the caller fills (`add_script`) and reads back (`failures`,
`requests`, `last_request`).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import uvicorn
from starlette.applications import Starlette

from app.scripted.anthropic import anthropic_routes
from app.scripted.openai import openai_routes
from app.scripted.script import Script, ScriptBook


def create_app(scripts: Mapping[str, Script] | ScriptBook) -> Starlette:
    """The ASGI app; its `ScriptBook` (failures, counters) is at `app.state.book`."""
    book = scripts if isinstance(scripts, ScriptBook) else ScriptBook(scripts)
    app = Starlette(routes=[*openai_routes(book), *anthropic_routes(book)])
    app.state.book = book
    return app


class ScriptedLLMServer:
    """Runs `create_app` under uvicorn in a background thread on a free local port."""

    def __init__(
        self, scripts: Mapping[str, Script] | None = None, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.book = ScriptBook(scripts)
        self._host = host
        self._port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """`http://HOST:PORT/v1`; valid once started."""
        if self._server is None:
            raise RuntimeError("ScriptedLLMServer is not started")
        return f"http://{self._host}:{self._port}/v1"

    @property
    def failures(self) -> list[str]:
        """Expectation failures seen so far (tests assert this is empty)."""
        return self.book.failures

    @property
    def requests(self) -> dict[str, int]:
        """Model name -> chat requests received."""
        return self.book.requests

    def add_script(self, model: str, script: Script) -> None:
        """Register (or replace) the script a model name plays; safe while serving."""
        self.book.add_script(model, script)

    def arrivals(self, model: str) -> list[float]:
        """`time.monotonic()` at each chat request's arrival for this model (same process)."""
        return self.book.arrivals(model)

    def last_request(self, model: str) -> dict[str, Any] | None:
        """The JSON body of the newest chat request for this model."""
        return self.book.last_request(model)

    def sent(self, model: str) -> list[dict[str, Any]]:
        """The token ids and logprobs of every captured answer for this model, in order."""
        return self.book.sent(model)

    def last_headers(self, model: str) -> dict[str, str] | None:
        """The (lower-cased) HTTP headers of the newest chat request for this model."""
        return self.book.last_headers(model)

    def start(self, timeout_s: float = 10.0) -> None:
        """Bind, serve from a thread with its own event loop, and wait until it accepts."""
        if self._server is not None:
            raise RuntimeError("ScriptedLLMServer is already started")
        # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets whose proto says
        # TCP, and without it every reused connection waits ~40 ms (Nagle + delayed ACK).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            create_app(self.book),
            loop="asyncio",
            lifespan="off",
            ws="none",
            log_config=None,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="scripted-llm", daemon=True
        )
        self._thread.start()
        self._wait_started(self._server, self._thread, timeout_s)

    def _wait_started(
        self, server: uvicorn.Server, thread: threading.Thread, timeout_s: float
    ) -> None:
        """Block until uvicorn reports started; fail loudly if its thread died."""
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("scripted LLM server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        """Ask uvicorn to exit and join its thread."""
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._server = None
        self._thread = None

    def __enter__(self) -> ScriptedLLMServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
