"""llama.cpp's server over HTTP from the `xllamacpp` package: `python THIS MODEL TEMPLATE PORT`.

Run as a child process by tests/real_llm/conftest.py and bench/real_llm.py, so it can be
killed mid-stream like any server. Used instead of the pinned `llama-server` binary on CPUs
that binary cannot run on (it dies with SIGILL on an AMD EPYC without AMX / AVX512-FP16);
the HTTP API is the same llama.cpp server.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import xllamacpp

CONTEXT_TOKENS = 8192


def main(model: str, template: str, port: int, threads: int = 2) -> None:
    params = xllamacpp.CommonParams()
    params.model.path = model
    params.n_ctx = CONTEXT_TOKENS
    params.n_parallel = 1
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.use_jinja = True
    params.chat_template = Path(template).read_text()
    params.hostnames = ["127.0.0.1"]
    params.port = port
    server = xllamacpp.Server(params)
    print(f"listening {server.listening_address}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
