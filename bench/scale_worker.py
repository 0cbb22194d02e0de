"""One of bench/scale.py's worker processes: a real `Worker` over the stand-in host.

    .venv/bin/python bench/scale_worker.py SAMPLES.json

Configured like `sandhive worker` (SANDHIVE_* from the environment), but its runner is
`standin.open_standin_runner`: commands and model turns are answered in process at
once, so the worker's time goes to the control plane. Each step write (the sink's
`attempts.save_step`: one transaction, then the live publish) is timed; the durations
are written to SAMPLES.json when the worker stops (SIGTERM).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from standin import open_standin_runner

from app import logs
from app.config import Settings
from app.services.tasks import attempts
from app.worker.pool import Worker


def time_step_writes(samples: list[float]) -> None:
    """Time every `attempts.save_step` of this process (the sink calls it through the module)."""
    save_step = attempts.save_step

    async def timed(*args: Any, **kwargs: Any) -> None:
        began = time.perf_counter()
        await save_step(*args, **kwargs)
        samples.append(time.perf_counter() - began)

    attempts.save_step = timed


async def serve(settings: Settings) -> None:
    worker = Worker(settings, runner=open_standin_runner)
    worker.install_signal_handlers()
    await worker.run()


def main() -> None:
    out = Path(sys.argv[1])
    settings = Settings()
    logs.setup(settings.log_format, settings.log_level)
    samples: list[float] = []
    time_step_writes(samples)
    asyncio.run(serve(settings))
    out.write_text(json.dumps({"step_write_s": samples}))


if __name__ == "__main__":
    main()
