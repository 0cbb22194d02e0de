"""Request/reply between the API and the worker holding a sandbox: a running task's, for its
files (`files`), or a caller's own (`sandboxes`).

The pattern of `app.bus.episodes` (whose `answer` and `wait_reply` it reuses): the task's
lease names its worker; the API pushes the request onto that worker's own list with a
fresh reply key and an expiry time; the worker answers on the reply key. A read is
answered with several replies on the same key, in order: the file's header, its chunks
(base64), then an end (or an abort when the sandbox failed part way).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from app.bus import keys
from app.bus.clock import redis_now
from app.bus.episodes import answer, wait_reply

__all__ = [
    "Sent",
    "abandon",
    "answer",
    "expired",
    "next_request",
    "requests_of",
    "room_for",
    "send",
    "wait_reply",
]
log = logging.getLogger(__name__)
ROOM_POLL_S = 0.05


def requests_of(worker: str, kind: str = "files") -> str:
    """The list of `kind` requests for `worker`: `files` for the tasks it runs,
    `sandboxes` for the sandboxes it holds (`app.worker.sandboxes`)."""
    return f"{keys.PREFIX}:{kind}:worker:{worker}"


@dataclass(frozen=True)
class Sent:
    """A request on a worker's list: its reply key, and its exact text (to take it back)."""

    worker: str
    reply: str
    body: str
    queue: str


async def send(
    redis: Redis, worker: str, request: dict[str, Any], *, timeout_s: float, kind: str = "files"
) -> Sent:
    """Push a request onto `worker`'s list; what to wait on (and to `abandon`).

    The request carries when the caller stops waiting: a worker that gets to it later
    drops it, so a write the API already answered 504 for does not land much later. The
    list expires with the last request's wait: nobody reads what a dead worker left.
    """
    reply = f"{keys.PREFIX}:{kind}:reply:{uuid.uuid4().hex}"
    expires = await redis_now(redis) + timeout_s  # read by a worker on another host
    body = json.dumps({**request, "reply": reply, "expires": expires})
    queue = requests_of(worker, kind)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.rpush(queue, body)
        pipe.expire(queue, max(1, math.ceil(timeout_s)))
        await pipe.execute()
    return Sent(worker, reply, body, queue)


async def abandon(redis: Redis, sent: Sent) -> None:
    """The caller stopped waiting (timeout, dead worker, client gone): take the request off
    the list if no worker took it yet, and drop whatever was answered."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.lrem(sent.queue, 1, sent.body)
        pipe.delete(sent.reply)
        await pipe.execute()


async def room_for(redis: Redis, reply: str, *, ahead: int, timeout_s: float) -> bool:
    """Wait until the reader has taken all but `ahead - 1` of the replies on `reply`; False
    after `timeout_s` (the reader is gone or stuck: stop sending)."""
    deadline = time.monotonic() + timeout_s
    while await redis.llen(reply) >= ahead:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(ROOM_POLL_S)
    return True


async def expired(redis: Redis, request: dict[str, Any]) -> bool:
    """Whether the caller has stopped waiting for this request, by Redis's clock (the
    caller's host wrote the deadline, this host reads it)."""
    expires = request.get("expires")
    return isinstance(expires, int | float) and await redis_now(redis) > expires


async def next_request(
    redis: Redis, worker: str, *, timeout_s: float, kind: str = "files"
) -> dict[str, Any] | None:
    got: Any = await redis.blpop([requests_of(worker, kind)], timeout=timeout_s)
    if got is None:
        return None
    try:
        request = json.loads(got[1])
    except ValueError:
        log.warning("files: dropped a request that is not JSON: %.200r", got[1])
        return None
    if not isinstance(request, dict):
        log.warning("files: dropped a request that is not an object: %.200r", got[1])
        return None
    return request
