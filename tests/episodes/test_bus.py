"""The request/reply of `app.bus.episodes` on a real Redis: one answer per request, the open
stream taken once by one of several workers, and a dead worker noticed within a slice."""

from __future__ import annotations

import asyncio
import time

from redis.asyncio import Redis

from app.bus import episodes as bus


async def test_a_request_is_answered_once_on_its_own_key(redis: Redis) -> None:
    first = await bus.send(redis, "w1", {"op": "step", "episode_id": "e1"})
    second = await bus.send(redis, "w1", {"op": "step", "episode_id": "e2"})
    assert first != second
    got = await bus.next_request(redis, "w1", timeout_s=1)
    assert got is not None
    assert (got["episode_id"], got["reply"]) == ("e1", first)
    await bus.answer(redis, got["reply"], {"n": 1})
    assert await bus.wait_reply(redis, first, timeout_s=1) == {"n": 1}
    assert await bus.wait_reply(redis, first, timeout_s=0.2) is None, "taken once"
    await bus.answer(redis, second, {"n": 2})
    assert 0 < await redis.ttl(second) <= bus.REPLY_TTL_S, "an unread answer expires"


async def test_one_open_request_goes_to_exactly_one_worker(redis: Redis) -> None:
    await bus.ensure_group(redis)
    reply = await bus.request_open(redis, "epi_1")
    claims = await asyncio.gather(*(bus.claim_open(redis, f"w{i}", block_ms=300) for i in range(3)))
    taken = [c for c in claims if c is not None]
    assert [(c.episode_id, c.reply) for c in taken] == [("epi_1", reply)]
    assert await redis.xlen(bus.OPEN_STREAM) == 0, "acked and deleted when taken"


async def test_waiting_stops_soon_after_the_worker_is_gone(redis: Redis) -> None:
    reply = await bus.send(redis, "w-dead", {"op": "step", "episode_id": "e"})
    calls = 0

    async def alive() -> bool:
        nonlocal calls
        calls += 1
        return calls < 2

    started = time.monotonic()
    assert await bus.wait_reply(redis, reply, timeout_s=30, alive=alive) is None
    assert time.monotonic() - started < 3 * bus.WAIT_SLICE_S


async def test_an_answer_given_just_before_the_worker_went_is_still_read(redis: Redis) -> None:
    reply = await bus.send(redis, "w-late", {"op": "step", "episode_id": "e"})

    async def gone_after_answering() -> bool:
        await bus.answer(redis, reply, {"ok": True})
        return False

    got = await bus.wait_reply(redis, reply, timeout_s=30, alive=gone_after_answering)
    assert got == {"ok": True}
