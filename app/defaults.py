"""Default numbers that more than one layer needs, written once.

`Settings` offers them as the server's defaults; the agent and sandbox layers,
which may not import `Settings`, use them as the defaults of their own
dataclasses (for tests and tools used on their own). Most are the reference
package's (REFERENCE.md): its working directory, its 120 s command timeout.
"""

WORKDIR = "/testbed"
MAX_STEPS = 100
COMMAND_TIMEOUT_S = 120
MAX_CONTEXT_TOKENS = 65536
CPUS = 1.0
MEMORY_MB = 1024
DISK_MB = 1024
SCRATCH_MB = 256
PIDS_LIMIT = 512
LLM_TIMEOUT_S = 1200.0
LLM_MAX_RETRIES = 3
LLM_RETRY_BACKOFF_S = 1.0
WARM_POOL_MAX_AGE_S = 600.0
SANDBOX_DEADLINE_S = 4 * 3600.0
"""Lifetime of a sandbox made outside a task (tests, tools used on their own): finite all the
same, so nothing Sandhive starts can outlive everything that could remove it."""
SANDBOX_RUNTIME = "runc"
"""Docker's own default OCI runtime, present on every daemon."""
DATABASE_PING_BYPASS_S = 0.5
"""HikariCP's `aliveBypassWindowMs`, of the same length (`app.db.engine`)."""
STREAM_CLIENT_BUFFER = 1000
STREAM_KEEPALIVE_S = 15.0
API_HEADER_TIMEOUT_S = 10.0
# The `python` scorer's sandbox (app.scoring.python_code, app.sandbox.python_scorer.score)
PYTHON_SCORER_CODE_MAX_BYTES = 256 * 1024
PYTHON_SCORER_TIMEOUT_S = 30
PYTHON_SCORER_MAX_TIMEOUT_S = 300
PYTHON_SCORER_MEMORY_MB = 256
PYTHON_SCORER_MAX_MEMORY_MB = 4096
PYTHON_SCORER_OUTPUT_BYTES = 64 * 1024
PYTHON_SCORER_MAX_OUTPUT_BYTES = 4 * 2**20
PYTHON_SCORER_PIDS_LIMIT = 64
PYTHON_SCORER_SCRATCH_MB = 64
