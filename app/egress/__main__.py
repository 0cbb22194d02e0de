"""`python3 -m egress --control PATH --port N --max-open N`: the proxy's process, in its own
container."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os

from .control import Control
from .proxy import HEAD_LIMIT, MAX_OPEN_TOTAL


async def main(control_path: str, port: int, max_open: int = MAX_OPEN_TOTAL) -> None:
    control = Control(max_open)
    proxy = await asyncio.start_server(control.proxy.handle, "0.0.0.0", port, limit=HEAD_LIMIT)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(control_path)  # a socket left by an earlier run of this container
    channel = await asyncio.start_unix_server(control.serve, control_path)
    os.chmod(control_path, 0o600)
    logging.getLogger("egress").info("proxy on :%d, control at %s", port, control_path)
    async with proxy, channel:
        await asyncio.gather(proxy.serve_forever(), channel.serve_forever())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="egress")
    parser.add_argument("--control", required=True)
    parser.add_argument("--port", type=int, default=3128)
    parser.add_argument("--max-open", type=int, default=MAX_OPEN_TOTAL)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(main(args.control, args.port, args.max_open))
