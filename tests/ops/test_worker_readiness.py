"""A worker's /readyz follows its Docker daemon going away and coming back.

The machine's dockerd is shared, so it is never stopped: the worker's
`DOCKER_HOST` points at a unix socket of the test's own, a small forwarding
proxy to the real daemon. Stopping the proxy is, for that worker, the daemon
going away (refused connections, cut keep-alive ones); starting it again is the
daemon coming back. A real `sandhive worker` subprocess, real Postgres and Redis.
While its Docker is away the worker claims nothing (the task waits instead of
failing as a sandbox error) and runs it once Docker is back.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from app.config import Settings
from app.db.engine import create_engine, create_sessions
from app.schemas.tasks import LLMOptions, TaskCreate
from app.scripted import Script, ScriptedLLMServer, Turn
from app.services.tasks import service as tasks
from tests.support.processes import free_port, settings_env

DOCKER_SOCKET = "/var/run/docker.sock"
WAIT_S = 60.0


class DockerProxy:
    """Forwards connections on `path` to the real Docker socket until stopped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._server: socketserver.ThreadingUnixStreamServer | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        proxy = self

        class Forward(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                upstream.connect(DOCKER_SOCKET)
                with proxy._lock:
                    proxy._open.update((self.request, upstream))
                back = threading.Thread(target=_pump, args=(upstream, self.request), daemon=True)
                back.start()
                _pump(self.request, upstream)
                back.join()

        self._server = socketserver.ThreadingUnixStreamServer(str(self.path), Forward)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Refuse new connections and cut the open ones, as a dead daemon would."""
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
        self.path.unlink(missing_ok=True)
        with self._lock:
            for sock in self._open:
                _close(sock)
            self._open.clear()
        self._server = None


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        _close(source)
        _close(target)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


@pytest.fixture
def docker_proxy() -> Iterator[DockerProxy]:
    # Not under tmp_path: a unix socket path must stay under ~108 bytes.
    root = Path(tempfile.mkdtemp(prefix="sandhive-dk-"))
    proxy = DockerProxy(root / "docker.sock")
    proxy.start()
    try:
        yield proxy
    finally:
        if proxy._server is not None:
            proxy.stop()
        shutil.rmtree(root, ignore_errors=True)


def wait_for(what: str, probe: Callable[[], Any], log: Path) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if found := probe():
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text(errors='replace')}")


def readyz(port: int) -> tuple[int, dict[str, str]] | None:
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
    except httpx.HTTPError:
        return None
    return response.status_code, response.json()


async def _submit(settings: Settings, model: str) -> str:
    engine = create_engine(settings.database_url)
    redis = Redis.from_url(settings.redis_url)
    try:
        task = TaskCreate(prompt="after docker", llm=LLMOptions(model=model))
        created = await tasks.submit_task(
            create_sessions(engine), redis, settings, "default", task, None
        )
        return created[0].id
    finally:
        await redis.aclose()
        await engine.dispose()


async def _status(settings: Settings, task_id: str) -> str:
    engine = create_engine(settings.database_url)
    try:
        return (await tasks.get_task(create_sessions(engine), "default", task_id)).status
    finally:
        await engine.dispose()


def status(settings: Settings, task_id: str) -> str:
    return asyncio.run(_status(settings, task_id))


def test_worker_readyz_goes_503_while_its_docker_is_away_and_200_when_back(
    settings: Settings, docker_proxy: DockerProxy, scripted_llm: ScriptedLLMServer, tmp_path: Path
) -> None:
    script = [Turn(tool="execute_bash", arguments={"command": "echo hi"}), Turn("submit")]
    scripted_llm.add_script("rdy-docker", Script(turns=script))
    port = free_port()
    config = settings.model_copy(
        update={"worker_metrics_port": port, "worker_ready_check_s": 0.3, "worker_name": "rdy"}
    )
    env = {**settings_env(config), "DOCKER_HOST": f"unix://{docker_proxy.path}"}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "app", "worker"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:

        def state(code: int) -> Callable[[], dict[str, str] | None]:
            return lambda: (r := readyz(port)) and r[0] == code and r[1]

        ready = wait_for("ready", state(200), log)
        expected = {"postgres": "ok", "redis": "ok", "docker": "ok", "images": "ok"}
        assert ready == {"status": "ok", **expected}

        docker_proxy.stop()
        away = wait_for("not ready", state(503), log)
        assert away["status"] == "not_ready"
        assert (away["postgres"], away["redis"]) == ("ok", "ok")
        assert away["docker"] != "ok"
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
        assert worker.poll() is None, "a worker without Docker waits, it does not exit"
        task_id = asyncio.run(_submit(config, "rdy-docker"))
        time.sleep(3)  # several claim rounds: a worker that claimed would have failed it by now
        assert status(config, task_id) == "queued", log.read_text(errors="replace")

        docker_proxy.start()
        back = wait_for("ready again", state(200), log)
        assert back["docker"] == "ok"
        done = wait_for("the task", lambda: status(config, task_id) == "succeeded", log)
        assert done
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
        assert "sandhive_worker_slots" in metrics.text  # the same port still serves metrics
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert "readiness of docker: failed" in log.read_text(), "the outage is logged"
    assert " slots on uvloop" in log.read_text(), "the worker's default event loop"
