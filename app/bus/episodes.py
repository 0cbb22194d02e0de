"""Request/reply between the API and the worker holding an episode's sandbox.

Opening: the API adds an "open" request to one stream read by a consumer group, so
whichever worker has a free episode slot takes it (as the task queue does).
Stepping and closing: the episode row names its worker; the API pushes the request
onto that worker's own list. Every request carries a fresh reply key the worker
answers exactly once (RPUSH, then an expiry so an answer nobody waits for goes
away); the API waits for it with BLPOP, in slices shorter than the Redis socket
timeout, and asks `alive` between slices, so a dead worker is noticed within a slice.

A deferred scorer's run has a lease of its own (`keys.episode_scoring`): set by the worker
before the row says the episode ended, renewed while it scores, deleted once the reward is
stored. Its absence (confirmed twice) is what tells the API and the sweep that nobody will
store that reward any more; the worker's heartbeat cannot (a worker restarted under the
same name beats again but holds none of its predecessor's scorings).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError
from redis.typing import EncodableT, FieldT

from app.bus import keys
from app.bus.clock import redis_now
from app.bus.presence import present

OPEN_STREAM = f"{keys.PREFIX}:episodes:open"
OPEN_GROUP = "episode-workers"
REPLY_TTL_S = 60
REQUESTS_TTL_S = 3600
WAIT_SLICE_S = 1.0


def requests_of(worker: str) -> str:
    """The list of step/close requests for the episodes `worker` holds."""
    return f"{keys.PREFIX}:episodes:worker:{worker}"


def _reply_key() -> str:
    return f"{keys.PREFIX}:episodes:reply:{uuid.uuid4().hex}"


@dataclass(frozen=True)
class OpenRequest:
    message_id: str
    episode_id: str
    reply: str
    image: str = "default"
    """Its catalogue image: a worker whose daemon lacks it passes the request on (`reopen`)."""
    deadline_ms: int | None = None
    """When the API stops waiting for the reply (epoch ms): a request passed on between
    workers that lack its image is dropped then, not passed on forever (`is_expired`)."""

    async def is_expired(self, redis: Redis) -> bool:
        """By Redis's clock: the API's host wrote the deadline, a worker's reads it."""
        return self.deadline_ms is not None and await redis_now(redis) * 1000 >= self.deadline_ms


async def ensure_group(redis: Redis) -> None:
    try:
        await redis.xgroup_create(OPEN_STREAM, OPEN_GROUP, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


async def request_open(
    redis: Redis, episode_id: str, image: str = "default", *, ttl_s: float | None = None
) -> str:
    """Ask any worker (that has the episode's `image`) to open it; the reply key to wait on.
    `ttl_s`: how long the caller waits for the reply (the request's deadline)."""
    reply = _reply_key()
    fields: dict[FieldT, EncodableT] = {"episode_id": episode_id, "reply": reply, "image": image}
    if ttl_s is not None:
        fields["deadline"] = str(int((await redis_now(redis) + ttl_s) * 1000))
    await redis.xadd(OPEN_STREAM, fields)
    return reply


async def reopen(redis: Redis, request: OpenRequest) -> bool:
    """Put an open request back for another worker (this one lacks its image); False, and
    nothing put back, once its deadline passed (nobody waits for the reply any more)."""
    if await request.is_expired(redis):
        return False
    fields: dict[FieldT, EncodableT] = {
        "episode_id": request.episode_id,
        "reply": request.reply,
        "image": request.image,
    }
    if request.deadline_ms is not None:
        fields["deadline"] = str(request.deadline_ms)
    await redis.xadd(OPEN_STREAM, fields)
    return True


async def claim_open(redis: Redis, consumer: str, *, block_ms: int) -> OpenRequest | None:
    try:
        got: Any = await redis.xreadgroup(
            OPEN_GROUP, consumer, {OPEN_STREAM: ">"}, count=1, block=block_ms
        )
    except ResponseError as exc:
        if "NOGROUP" not in str(exc):
            raise
        await ensure_group(redis)
        return None
    if not got:
        return None
    message_id, fields = got[0][1][0]
    # Acked at once: the episode row, not the message, says whether it still needs a worker.
    await redis.xack(OPEN_STREAM, OPEN_GROUP, message_id)
    await redis.xdel(OPEN_STREAM, message_id)
    image = _text(fields.get(b"image", b"default"))
    episode_id, reply = _text(fields[b"episode_id"]), _text(fields[b"reply"])
    deadline = fields.get(b"deadline")
    deadline_ms = int(_text(deadline)) if deadline else None
    return OpenRequest(_text(message_id), episode_id, reply, image, deadline_ms)


async def send(redis: Redis, worker: str, request: dict[str, Any]) -> str:
    """Push a request onto `worker`'s list; the reply key to wait on."""
    reply = _reply_key()
    async with redis.pipeline(transaction=True) as pipe:
        pipe.rpush(requests_of(worker), json.dumps({**request, "reply": reply}))
        # A dead worker's list is never read again: it goes an hour after the last request.
        pipe.expire(requests_of(worker), REQUESTS_TTL_S)
        await pipe.execute()
    return reply


# KEYS: the worker's heartbeat, its request list. ARGV: the request, the list's TTL.
# Queued only while the worker is alive: a step never reaches a worker already declared lost.
_SEND_TO_LIVE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""


async def send_to_live(redis: Redis, worker: str, request: dict[str, Any]) -> str | None:
    """`send`, but only while `worker`'s heartbeat is alive, checked in the same round trip
    (the step path's one Redis call before the wait); None, nothing queued, when it is gone."""
    reply = _reply_key()
    queued = await redis.register_script(_SEND_TO_LIVE)(
        keys=[keys.worker_heartbeat(worker), requests_of(worker)],
        args=[json.dumps({**request, "reply": reply}), REQUESTS_TTL_S],
    )
    return reply if queued else None


async def next_request(redis: Redis, worker: str, *, timeout_s: float) -> dict[str, Any] | None:
    got: Any = await redis.blpop([requests_of(worker)], timeout=timeout_s)
    if got is None:
        return None
    request: dict[str, Any] = json.loads(got[1])
    return request


async def answer(redis: Redis, reply: str, payload: dict[str, Any]) -> None:
    async with redis.pipeline(transaction=True) as pipe:
        pipe.rpush(reply, json.dumps(payload))
        pipe.expire(reply, REPLY_TTL_S)
        await pipe.execute()


async def wait_reply(
    redis: Redis,
    reply: str,
    *,
    timeout_s: float,
    alive: Callable[[], Awaitable[bool]] | None = None,
) -> dict[str, Any] | None:
    """The reply, or None after `timeout_s` or as soon as `alive` says the worker is gone."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        got: Any = await redis.blpop([reply], timeout=min(WAIT_SLICE_S, max(left, 0.01)))
        if got is not None:
            payload: dict[str, Any] = json.loads(got[1])
            return payload
        if alive is not None and not await alive():
            # One more look: the answer may have come just before the worker went.
            last: Any = await redis.lpop(reply)
            return json.loads(last) if last is not None else None


async def hold_scoring(redis: Redis, episode_id: str, worker: str, ttl_s: float) -> None:
    """Say `worker` scores the episode's answer for the next `ttl_s` (set or renewed)."""
    await redis.set(keys.episode_scoring(episode_id), worker, px=max(1, int(ttl_s * 1000)))


async def drop_scoring(redis: Redis, episode_id: str) -> None:
    """The reward is stored (or will never be, by this worker): nobody scores it now."""
    await redis.delete(keys.episode_scoring(episode_id))


async def scoring(redis: Redis, episode_ids: Collection[str]) -> set[str]:
    """The episodes among `episode_ids` whose scoring lease some worker holds now."""
    return await present(redis, episode_ids, keys.episode_scoring)


def _free_key(worker: str) -> str:
    return f"{keys.PREFIX}:episodes:free:{worker}"


async def tell_free(redis: Redis, worker: str, free: int, ttl_s: float) -> None:
    """Say how many episodes `worker` can open now (gone after `ttl_s` unless said again)."""
    await redis.set(_free_key(worker), str(free), px=max(1, int(ttl_s * 1000)))


async def free_slots(redis: Redis, workers: Collection[str]) -> dict[str, int]:
    """What each of `workers` last said it can open; a worker that said nothing is left out."""
    names = sorted(workers)
    if not names:
        return {}
    said: list[Any] = await redis.mget([_free_key(name) for name in names])
    return {name: int(value) for name, value in zip(names, said, strict=True) if value is not None}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
