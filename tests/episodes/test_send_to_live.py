"""`app.bus.episodes.send_to_live` on a real Redis: a request reaches a worker's list only
while its heartbeat is alive, checked and queued in one round trip."""

from __future__ import annotations

from redis.asyncio import Redis

from app.bus import episodes as bus
from app.bus import keys


async def test_a_request_is_queued_only_for_a_live_worker(redis: Redis) -> None:
    request = {"op": "step", "episode_id": "e1"}
    assert await bus.send_to_live(redis, "w-gone", request) is None
    assert await redis.exists(bus.requests_of("w-gone")) == 0, "nothing queued for the dead"

    await redis.set(keys.worker_heartbeat("w-live"), "1", px=5000)
    reply = await bus.send_to_live(redis, "w-live", request)
    assert reply is not None
    got = await bus.next_request(redis, "w-live", timeout_s=1)
    assert got == {**request, "reply": reply}
    await bus.send_to_live(redis, "w-live", request)
    assert 0 < await redis.ttl(bus.requests_of("w-live")) <= bus.REQUESTS_TTL_S
