"""Wake-ups for an experiment's followers: "events up to `seq` are committed".

Pub/sub, not a stream: the events themselves are in Postgres (`experiment_events`), which
followers replay after the `seq` they hold, so a missed wake-up costs a poll interval,
never an event. Writers call `notify` after their commit.
"""

from __future__ import annotations

from redis.asyncio import Redis

from app.bus import keys


async def notify(redis: Redis, experiment_id: str, seq: int) -> None:
    """Tell followers of `experiment_id` that its events up to `seq` are committed."""
    await redis.publish(keys.experiment_events(experiment_id), str(seq))
