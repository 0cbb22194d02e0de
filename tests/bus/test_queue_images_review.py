"""The per-image queue's review findings on a real Redis: the stream registry instead of a
SCAN, one script run for an idle wait, per-stream message identity, reclaim in one round
trip from a rotating start, and per-stream backlogs for /metrics."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from redis.asyncio import Redis

from app.bus import episodes, keys, queue
from app.worker import taking

BOTH = queue.streams_of(["default", "extra"])
EXTRA = keys.task_stream("extra")


class CountingRedis(Redis):
    """A real client that counts the scripts it runs (Redis still runs each of them)."""

    scripts = 0

    async def evalsha(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        CountingRedis.scripts += 1
        return await super().evalsha(*args, **kwargs)


async def test_streams_are_found_in_the_registry_written_on_enqueue_and_group_creation(
    redis: Redis,
) -> None:
    await queue.enqueue(redis, "tsk_a", "extra")
    await queue.ensure_group(redis, [keys.task_stream("java")])
    registered = {raw.decode() for raw in await redis.smembers(keys.STREAM_REGISTRY)}
    assert registered == {EXTRA, keys.task_stream("java")}
    await redis.xadd(f"{keys.IMAGE_STREAM_PREFIX}stray", {"task_id": "x"})  # not ours: no SCAN
    assert await queue.all_streams(redis) == sorted(
        [keys.TASK_STREAM, EXTRA, keys.task_stream("java")]
    )
    assert await queue.all_streams(redis, [keys.task_stream("zeta")]) == sorted(
        [keys.TASK_STREAM, EXTRA, keys.task_stream("java"), keys.task_stream("zeta")]
    )
    assert await queue.queued_task_ids(redis) == {"tsk_a"}
    assert await queue.depth(redis) == 1


async def test_an_idle_wait_runs_the_claim_script_once(
    redis: Redis, private_redis_url: str
) -> None:
    await queue.ensure_group(redis, BOTH)
    counting = CountingRedis.from_url(private_redis_url)
    try:
        # Loaded first: an EVALSHA of a script the server does not have yet (a fresh or
        # flushed Redis) fails NOSCRIPT and is sent again, and that is not a second claim.
        await queue.claim(counting, "w", block_ms=1, streams=BOTH)
        CountingRedis.scripts = 0
        assert await queue.claim(counting, "w", block_ms=50, streams=BOTH) is None
        assert CountingRedis.scripts == 1, "nothing arrived: no second run"
        await queue.enqueue(redis, "tsk_a", "extra")
        claim = await queue.claim(counting, "w", block_ms=50, streams=BOTH)
        assert claim is not None
        assert claim.task_id == "tsk_a"
    finally:
        await counting.aclose()


async def test_a_duplicate_with_the_same_id_on_another_stream_is_dropped(redis: Redis) -> None:
    await queue.ensure_group(redis, BOTH)
    await redis.xadd(keys.TASK_STREAM, {"task_id": "tsk_t"}, id="5-0")  # an old worker's copy
    await redis.xadd(EXTRA, {"task_id": "tsk_t"}, id="5-0")
    first = await taking.take(redis, "w1", lease_ms=5_000, reclaim=False, block_ms=50, streams=BOTH)
    assert first is not None
    assert (first.claim.stream, first.claim.message_id) == (keys.TASK_STREAM, "5-0")
    second = await taking.take(
        redis, "w2", lease_ms=5_000, reclaim=False, block_ms=50, streams=BOTH
    )
    assert second is None, "w1 leases the task"
    assert await redis.xlen(EXTRA) == 0, "not w1's message (same id, other stream): acked"
    assert await redis.xlen(keys.TASK_STREAM) == 1, "w1's own is kept"


async def test_reclaim_starts_from_a_different_stream_each_time(redis: Redis) -> None:
    await queue.ensure_group(redis, BOTH)
    for image in ("default", "extra"):
        await queue.enqueue(redis, f"tsk_{image}", image)
        assert await queue.claim(redis, "dead", block_ms=50, streams=BOTH) is not None
    streams = set()
    for _ in range(2):
        claim = await queue.reclaim(redis, "w", min_idle_ms=0, streams=BOTH)
        assert claim is not None
        streams.add(claim.stream)
    assert streams == set(BOTH), "both streams' dead messages came back, not the first twice"


async def test_a_reclaim_takes_only_the_message_it_returns(redis: Redis) -> None:
    await queue.ensure_group(redis, BOTH)
    for image in ("default", "extra"):
        await queue.enqueue(redis, f"tsk_{image}", image)
        assert await queue.claim(redis, "dead", block_ms=50, streams=BOTH) is not None
    claim = await queue.reclaim(redis, "w", min_idle_ms=0, streams=BOTH)
    assert claim is not None
    other = next(stream for stream in BOTH if stream != claim.stream)
    (entry,) = await redis.xpending_range(other, keys.WORKER_GROUP, "-", "+", 10)
    assert entry["consumer"] == b"dead", "the other stream's message is left for others"


async def test_backlogs_count_what_no_worker_read_and_its_age(redis: Redis) -> None:
    await queue.ensure_group(redis, [keys.TASK_STREAM])
    before_ms = int(time.time() * 1000)
    await queue.enqueue(redis, "tsk_1")
    await queue.enqueue(redis, "tsk_2")
    await queue.enqueue(redis, "tsk_x", "extra")  # no group yet: waits all the same
    assert await queue.claim(redis, "w", block_ms=50, streams=[keys.TASK_STREAM]) is not None
    default, extra, absent = await queue.backlogs(
        redis, [keys.TASK_STREAM, EXTRA, keys.task_stream("none")]
    )
    assert (default.waiting, extra.waiting, absent.waiting) == (1, 1, 0)
    assert default.oldest_ms is not None
    assert extra.oldest_ms is not None
    assert default.oldest_ms >= before_ms
    assert absent.oldest_ms is None


async def test_an_open_request_passed_between_workers_is_dropped_past_its_deadline(
    redis: Redis,
) -> None:
    await episodes.ensure_group(redis)
    await episodes.request_open(redis, "ep_live", "extra", ttl_s=60)
    live = await episodes.claim_open(redis, "w-plain", block_ms=50)
    assert live is not None
    assert not await live.is_expired(redis)
    assert await episodes.reopen(redis, live), "its caller still waits: passed on"
    again = await episodes.claim_open(redis, "w-plain", block_ms=50)
    assert again is not None
    assert (again.episode_id, again.deadline_ms) == ("ep_live", live.deadline_ms)
    await episodes.request_open(redis, "ep_late", "extra", ttl_s=0)
    late = await episodes.claim_open(redis, "w-plain", block_ms=50)
    assert late is not None
    assert await late.is_expired(redis)
    assert not await episodes.reopen(redis, late), "nobody waits for it any more"
    assert await episodes.claim_open(redis, "w-plain", block_ms=50) is None


async def test_a_new_message_wakes_one_idle_worker_not_all(redis: Redis) -> None:
    await queue.ensure_group(redis, BOTH)
    waiting = [
        asyncio.create_task(queue.claim(redis, f"w{i}", block_ms=5_000, streams=BOTH))
        for i in range(3)
    ]
    await asyncio.sleep(0.3)  # all three blocked
    await queue.enqueue(redis, "tsk_1", "extra")
    done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED, timeout=4)
    (first,) = done
    claim = first.result()
    assert claim is not None
    assert claim.task_id == "tsk_1"
    await asyncio.sleep(0.3)
    still = [task for task in waiting if task is not first]
    assert not any(task.done() for task in still), "the others were not woken for nothing"
    await queue.enqueue(redis, "tsk_2")
    await queue.enqueue(redis, "tsk_3", "extra")
    claims = await asyncio.wait_for(asyncio.gather(*still), 4)
    assert sorted(c.task_id for c in claims if c is not None) == ["tsk_2", "tsk_3"]


async def test_messages_read_together_from_two_streams_give_the_oldest_and_keep_the_rest(
    redis: Redis,
) -> None:
    await queue.ensure_group(redis, BOTH)
    await redis.xadd(EXTRA, {"task_id": "tsk_old"}, id="5-0")
    await redis.xadd(keys.TASK_STREAM, {"task_id": "tsk_new"}, id="6-0")
    got = await redis.xreadgroup(
        keys.WORKER_GROUP, "w", dict.fromkeys(BOTH, ">"), count=1, block=50
    )
    assert len(got) == 2, "one from each stream"
    claim = await queue._first_of(redis, got)
    assert claim is not None
    assert (claim.task_id, claim.stream) == ("tsk_old", EXTRA)
    assert await queue.messages_of(redis, keys.TASK_STREAM) != {"6-0": "tsk_new"}
    assert list((await queue.messages_of(redis, keys.TASK_STREAM)).values()) == ["tsk_new"]
    again = await queue.claim(redis, "w2", block_ms=50, streams=BOTH)
    assert again is not None
    assert again.task_id == "tsk_new", "put back as a fresh message, not left pending on w"
