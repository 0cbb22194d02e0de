"""A step sent again with the same `Idempotency-Key` gets the first one's answer: the trainer's
turn runs once, however often a flaky network makes the trainer retry it.

The first request with a key claims it in Redis (`SET NX`, with a hash of its message) and,
once its step is answered, stores the answer there (or the error it ended with) for
`SANDHIVE_EPISODE_STEP_KEY_TTL_S`. A repeat waits while the first is still running and then
answers what it answered; a repeat with another message is a 422 (the key names one turn).
If the API process running the first dies mid-step, its claim lapses after the step's
timeout and the repeat is told so (503): whether the turn ran is then unknown.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

from app.bus import keys
from app.errors import AppError, IdempotencyKeyReused, Unavailable
from app.schemas.episodes import EpisodeStepOut

POLL_S = 0.05
RETRY_S = 5


def _key(episode_id: str, key: str) -> str:
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return f"{keys.PREFIX}:episodes:step-key:{episode_id}:{digest}"


def _fingerprint(message: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(message, sort_keys=True).encode()).hexdigest()


async def once(
    redis: Redis,
    episode_id: str,
    key: str,
    message: dict[str, Any],
    *,
    ttl_s: float,
    claim_s: float,
    step: Callable[[], Awaitable[EpisodeStepOut]],
) -> EpisodeStepOut:
    """`step()` the first time `key` comes for this episode; the stored outcome after.
    `claim_s`: how long the first may take (its claim lapses after)."""
    name, fingerprint = _key(episode_id, key), _fingerprint(message)
    claim = json.dumps({"pending": fingerprint})
    if await redis.set(name, claim, nx=True, px=int(claim_s * 1000)):
        return await _first(redis, name, fingerprint, ttl_s, step)
    return await _repeat(redis, name, fingerprint, claim_s)


async def _first(
    redis: Redis,
    name: str,
    fingerprint: str,
    ttl_s: float,
    step: Callable[[], Awaitable[EpisodeStepOut]],
) -> EpisodeStepOut:
    try:
        answer = await step()
    except AppError as exc:
        stored = {"error": _error(exc), "fingerprint": fingerprint}
        await redis.set(name, json.dumps(stored), px=int(ttl_s * 1000))
        raise
    except BaseException:
        await redis.delete(name)  # no outcome to give: a repeat runs the step itself
        raise
    stored = {"answer": answer.model_dump(mode="json"), "fingerprint": fingerprint}
    await redis.set(name, json.dumps(stored), px=int(ttl_s * 1000))
    return answer


async def _repeat(redis: Redis, name: str, fingerprint: str, claim_s: float) -> EpisodeStepOut:
    deadline = time.monotonic() + claim_s + 1.0
    while True:
        raw: Any = await redis.get(name)
        if raw is None:
            raise Unavailable(
                "the first request with this Idempotency-Key was lost with its API process"
                " before it answered: whether its turn ran is unknown (read the episode)",
                RETRY_S,
            )
        stored = json.loads(raw)
        if stored.get("pending", stored.get("fingerprint")) != fingerprint:
            raise IdempotencyKeyReused(
                "this Idempotency-Key was sent with another message: a retry repeats the"
                " same turn, a new turn takes a new key"
            )
        if "answer" in stored:
            return EpisodeStepOut.model_validate(stored["answer"])
        if "error" in stored:
            raise _Stored(stored["error"])
        if time.monotonic() > deadline:
            raise Unavailable("the first request with this Idempotency-Key is still running", 1)
        await asyncio.sleep(POLL_S)


def _error(exc: AppError) -> dict[str, Any]:
    retry = getattr(exc, "retry_after_s", None)
    return {
        "status": exc.status,
        "code": exc.code,
        "message": exc.message,
        "details": exc.details,
        "retry_after_s": retry,
    }


class _Stored(AppError):
    """The first request's error, answered again to its repeats as it was."""

    def __init__(self, stored: dict[str, Any]) -> None:
        super().__init__(str(stored["message"]), stored.get("details"))
        self.status, self.code = int(stored["status"]), str(stored["code"])
        self._retry = stored.get("retry_after_s")

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self._retry)} if self._retry else {}
