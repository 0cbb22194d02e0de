"""Task leases and worker heartbeats on a real Redis: exclusive, renewable, fenced release."""

from __future__ import annotations

from redis.asyncio import Redis

from app.bus import cancel, keys, leases, queue

LEASE_MS = 5_000


async def claimed(redis: Redis, task_id: str, consumer: str) -> str:
    await queue.ensure_group(redis)
    await queue.enqueue(redis, task_id)
    claim = await queue.claim(redis, consumer, block_ms=100)
    assert claim is not None
    return claim.message_id


async def test_lease_is_exclusive(redis: Redis) -> None:
    mine = leases.holder_of("w1", "1-0")
    assert await leases.acquire(redis, "tsk_a", mine, LEASE_MS) is None
    assert await leases.acquire(redis, "tsk_a", leases.holder_of("w2", "2-0"), LEASE_MS) == mine
    assert leases.message_of(mine) == "1-0"
    assert await leases.held(redis, ["tsk_a", "tsk_b"]) == {"tsk_a"}


async def test_renew_keeps_the_lease_and_resets_the_message_idle_time(redis: Redis) -> None:
    message_id = await claimed(redis, "tsk_a", "w1")
    holder = leases.holder_of("w1", message_id)
    await leases.acquire(redis, "tsk_a", holder, 200)
    await redis.pexpire(keys.task_lease("tsk_a"), 50)
    assert await leases.renew(
        redis, "tsk_a", holder, LEASE_MS, consumer="w1", message_id=message_id
    )
    assert await redis.pttl(keys.task_lease("tsk_a")) > 1_000
    pending = await redis.xpending_range(keys.TASK_STREAM, keys.WORKER_GROUP, "-", "+", 1)
    assert pending[0]["time_since_delivered"] < 1_000
    assert pending[0]["consumer"] == b"w1"


async def test_renew_takes_back_a_lease_redis_lost(redis: Redis) -> None:
    holder = leases.holder_of("w1", "1-0")
    await leases.acquire(redis, "tsk_a", holder, LEASE_MS)
    await redis.flushdb()
    assert await leases.renew(redis, "tsk_a", holder, LEASE_MS, consumer="w1", message_id="1-0")
    assert await redis.get(keys.task_lease("tsk_a")) == holder.encode()


async def test_renew_fails_once_another_worker_holds_the_task(redis: Redis) -> None:
    await leases.acquire(redis, "tsk_a", leases.holder_of("w2", "2-0"), LEASE_MS)
    mine = leases.holder_of("w1", "1-0")
    assert not await leases.renew(redis, "tsk_a", mine, LEASE_MS, consumer="w1", message_id="1-0")


async def test_release_acks_only_for_the_holder(redis: Redis) -> None:
    message_id = await claimed(redis, "tsk_a", "w1")
    stale = leases.holder_of("w1", message_id)
    await leases.acquire(redis, "tsk_a", leases.holder_of("w2", "9-9"), LEASE_MS)
    assert not await leases.release(redis, "tsk_a", stale, message_id)
    assert await queue.queued_task_ids(redis) == {"tsk_a"}, "a stale worker acks nothing"
    await redis.delete(keys.task_lease("tsk_a"))
    await leases.acquire(redis, "tsk_a", stale, LEASE_MS)
    assert await leases.release(redis, "tsk_a", stale, message_id)
    assert await queue.queued_task_ids(redis) == set()
    assert await leases.held(redis, ["tsk_a"]) == set()


async def test_release_with_requeue_puts_a_fresh_message_on_the_queue(redis: Redis) -> None:
    message_id = await claimed(redis, "tsk_a", "w1")
    holder = leases.holder_of("w1", message_id)
    await leases.acquire(redis, "tsk_a", holder, LEASE_MS)
    assert await leases.release(redis, "tsk_a", holder, message_id, requeue=True)
    again = await queue.claim(redis, "w2", block_ms=100)
    assert again is not None
    assert again.task_id == "tsk_a"
    assert again.message_id != message_id
    assert (await redis.xpending(keys.TASK_STREAM, keys.WORKER_GROUP))["pending"] == 1


async def test_heartbeats_say_who_is_alive(redis: Redis) -> None:
    await leases.beat(redis, "w1", LEASE_MS, {"pid": 1})
    await leases.beat(redis, "w2", LEASE_MS, {"pid": 2})
    assert await leases.alive(redis, ["w1", "w2", "w3"]) == {"w1", "w2"}
    await leases.forget(redis, "w2")
    assert await leases.alive(redis, ["w1", "w2"]) == {"w1"}
    assert await leases.alive(redis, []) == set()


async def test_cancel_flags(redis: Redis) -> None:
    await cancel.raise_flag(redis, "tsk_a")
    assert await cancel.flagged(redis, ["tsk_a", "tsk_b"]) == {"tsk_a"}
    assert 0 < await redis.ttl(keys.cancel_flag("tsk_a")) <= cancel.FLAG_TTL_S
    await cancel.clear(redis, "tsk_a")
    assert await cancel.flagged(redis, ["tsk_a"]) == set()
