"""One stream per catalogue image on a real Redis: a worker reads only the images it has,
the oldest message first across them, and every hand-back returns to the image's stream."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from app.bus import keys, leases, queue
from app.worker import taking

BOTH = queue.streams_of(["default", "extra"])


async def test_a_worker_reads_only_the_streams_of_its_images(redis: Redis) -> None:
    await queue.ensure_group(redis, BOTH)
    await queue.enqueue(redis, "tsk_extra", "extra")
    only_default = queue.streams_of(["default"])
    assert await queue.claim(redis, "w-plain", block_ms=50, streams=only_default) is None
    assert await queue.reclaim(redis, "w-plain", min_idle_ms=0, streams=only_default) is None
    assert await queue.queued_task_ids(redis) == {"tsk_extra"}, "it waits, queued"
    assert await queue.depth(redis) == 1
    claim = await queue.claim(redis, "w-extra", block_ms=50, streams=BOTH)
    assert claim is not None
    assert (claim.task_id, claim.stream) == ("tsk_extra", keys.task_stream("extra"))
    assert keys.task_stream("default") == keys.TASK_STREAM, "no catalogue: the keys of old"


async def test_the_oldest_message_comes_first_whichever_stream_it_is_on(redis: Redis) -> None:
    await queue.ensure_group(redis, BOTH)
    for task_id, image in [("t1", "extra"), ("t2", "default"), ("t3", "extra"), ("t4", "default")]:
        await queue.enqueue(redis, task_id, image)
        await asyncio.sleep(0.005)  # ids are per stream: across streams, ordered by the ms
    order = []
    for _ in range(4):
        claim = await queue.claim(redis, "w", block_ms=50, streams=BOTH)
        assert claim is not None
        order.append(claim.task_id)
    assert order == ["t1", "t2", "t3", "t4"]
    assert await queue.claim(redis, "w", block_ms=50, streams=BOTH) is None


async def test_a_blocked_claim_wakes_for_a_message_on_any_of_its_streams(redis: Redis) -> None:
    await queue.ensure_group(redis, BOTH)
    waiting = asyncio.create_task(queue.claim(redis, "w", block_ms=5_000, streams=BOTH))
    await asyncio.sleep(0.2)
    await queue.enqueue(redis, "tsk_late", "extra")
    claim = await asyncio.wait_for(waiting, 4.0)
    assert claim is not None
    assert claim.task_id == "tsk_late"


async def test_a_missing_group_is_made_again_and_the_message_still_delivered(
    redis: Redis,
) -> None:
    await queue.enqueue(redis, "tsk_early", "extra")  # before any worker made the group
    assert await queue.claim(redis, "w", block_ms=50, streams=BOTH) is None
    claim = await queue.claim(redis, "w", block_ms=50, streams=BOTH)
    assert claim is not None
    assert claim.task_id == "tsk_early"


async def test_given_back_and_renewed_on_the_stream_it_came_from(redis: Redis) -> None:
    await queue.ensure_group(redis, BOTH)
    await queue.enqueue(redis, "tsk_x", "extra")
    taken = await taking.take(redis, "w1", lease_ms=5_000, reclaim=False, block_ms=50, streams=BOTH)
    assert taken is not None
    renewed = await leases.renew(
        redis,
        taken.task_id,
        taken.holder,
        5_000,
        consumer="w1",
        message_id=taken.claim.message_id,
        stream=taken.claim.stream,
    )
    assert renewed
    await taking.give_back(redis, taken)
    assert await redis.xlen(keys.task_stream("extra")) == 1
    assert await redis.xlen(keys.TASK_STREAM) == 0
    again = await taking.take(redis, "w2", lease_ms=5_000, reclaim=False, block_ms=50, streams=BOTH)
    assert again is not None
    assert (again.task_id, again.claim.stream) == ("tsk_x", keys.task_stream("extra"))
    await asyncio.sleep(0.1)
    back = await taking.take(redis, "w3", lease_ms=50, reclaim=True, block_ms=50, streams=BOTH)
    assert back is None, "w2 still holds the lease: its reclaimed message is not started twice"
