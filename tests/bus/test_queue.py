"""The task queue on a real Redis: claim, ack, reclaim by idle time, dead letters, lost data."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from app.bus import keys, queue


async def test_claim_then_ack_removes_the_message(redis: Redis) -> None:
    await queue.ensure_group(redis)
    await queue.enqueue(redis, "tsk_a")
    claim = await queue.claim(redis, "w1", block_ms=100)
    assert claim is not None
    assert claim.task_id == "tsk_a"
    assert await queue.claim(redis, "w2", block_ms=50) is None, "delivered once"
    assert await queue.queued_task_ids(redis) == {"tsk_a"}, "unacked: still on the queue"
    await queue.ack(redis, claim.message_id)
    assert await queue.queued_task_ids(redis) == set()
    assert (await redis.xpending(keys.TASK_STREAM, keys.WORKER_GROUP))["pending"] == 0


async def test_reclaim_takes_only_messages_idle_longer_than_the_lease(redis: Redis) -> None:
    await queue.ensure_group(redis)
    await queue.enqueue(redis, "tsk_a")
    first = await queue.claim(redis, "dead", block_ms=100)
    assert first is not None
    assert await queue.reclaim(redis, "alive", min_idle_ms=60_000) is None
    await asyncio.sleep(0.2)
    taken = await queue.reclaim(redis, "alive", min_idle_ms=100)
    assert taken == first
    pending = await redis.xpending_range(keys.TASK_STREAM, keys.WORKER_GROUP, "-", "+", 10)
    assert [p["consumer"] for p in pending] == [b"alive"]


async def test_group_created_before_entries_delivers_them(redis: Redis) -> None:
    """Created at 0, not $: what was enqueued before the group existed is not skipped."""
    await queue.enqueue(redis, "tsk_early")
    await queue.ensure_group(redis)
    await queue.ensure_group(redis)  # idempotent
    claim = await queue.claim(redis, "w1", block_ms=100)
    assert claim is not None
    assert claim.task_id == "tsk_early"


async def test_malformed_message_is_dead_lettered_and_acked(redis: Redis) -> None:
    await queue.ensure_group(redis)
    await redis.xadd(keys.TASK_STREAM, {"something": "else"})
    await queue.enqueue(redis, "tsk_good")
    assert await queue.claim(redis, "w1", block_ms=100) is None
    good = await queue.claim(redis, "w1", block_ms=100)
    assert good is not None
    assert good.task_id == "tsk_good"
    dead = await redis.xrange(keys.DEAD_LETTERS)
    assert [fields[b"reason"] for _, fields in dead] == [b"no task_id"]
    assert await queue.queued_task_ids(redis) == {"tsk_good"}


async def test_lost_redis_data_recreates_the_group(redis: Redis) -> None:
    await queue.ensure_group(redis)
    await redis.flushdb()  # what a restart without persistence leaves
    assert await queue.claim(redis, "w1", block_ms=50) is None
    assert await queue.reclaim(redis, "w1", min_idle_ms=0) is None
    await queue.enqueue(redis, "tsk_after")
    claim = await queue.claim(redis, "w1", block_ms=100)
    assert claim is not None
    assert claim.task_id == "tsk_after"


async def test_queued_task_ids_pages_through_a_long_stream(redis: Redis) -> None:
    for n in range(queue.SCAN_PAGE + 5):
        await redis.xadd(keys.TASK_STREAM, {"task_id": f"tsk_{n}"})
    found = await queue.queued_task_ids(redis)
    assert len(found) == queue.SCAN_PAGE + 5
