"""Taking a task: read a queue message and take its task's lease, the first thing a worker does.

One function for the pool and for the fault test that kills a process right
after this step (tests/e2e/test_faults_worker_killed.py), so that test dies
exactly where a worker would. After `take` the caller holds the message (the
group's pending list) and the lease; Postgres is untouched (the task is still
`queued`), so a death here costs no attempt: the lease expires, another worker
reclaims the message and starts attempt 1.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from app.bus import keys, leases, queue
from app.bus.queue import Claim


@dataclass(frozen=True)
class Taken:
    """A message this worker read and the lease it holds on the message's task."""

    claim: Claim
    holder: str
    reclaimed: bool = False
    """Taken back through XAUTOCLAIM after its lease lapsed: a dead worker's task, or this
    worker's own when its loop stalled past the lease. Only the pool, which knows what it
    runs, can tell which, so it does the logging and the RECLAIMED count."""
    already_running: bool = False
    """The task is one this worker runs now: not leased here (the running attempt's
    renewals keep the lease), for the pool to drop or keep."""

    @property
    def task_id(self) -> str:
        return self.claim.task_id


async def take(
    redis: Redis,
    worker: str,
    *,
    lease_ms: int,
    reclaim: bool,
    block_ms: int,
    running: Container[str] = frozenset(),
    streams: Sequence[str] = (keys.TASK_STREAM,),
) -> Taken | None:
    """The next task to run, leased; None when there is none within block_ms.

    With `reclaim`, a dead worker's message (idle for a whole lease) comes
    first. A message whose task another holder leases is skipped: acked when it
    is a duplicate (the holder runs the task from its own message), left alone
    when it is the holder's own (it renews it and acks it when done). Only `streams` are
    read: those of the images this worker's daemon has (`app.bus.queue`). A task in
    `running` (this worker's own) is returned unleased, `already_running`: taking
    its lease here, even for a moment, would make the running attempt's next
    renewal see another holder and stop.
    """
    if reclaim:
        claim = await queue.reclaim(redis, worker, min_idle_ms=lease_ms, streams=streams)
        if claim is not None:
            taken = await _lease(redis, worker, claim, lease_ms, running, reclaimed=True)
            if taken is not None:
                return taken
    while True:  # skip duplicates without a pause: a queue full of them must not stall us
        claim = await queue.claim(redis, worker, block_ms=block_ms, streams=streams)
        if claim is None:
            return None
        taken = await _lease(redis, worker, claim, lease_ms, running)
        if taken is not None:
            return taken


async def _lease(
    redis: Redis,
    worker: str,
    claim: Claim,
    lease_ms: int,
    running: Container[str],
    *,
    reclaimed: bool = False,
) -> Taken | None:
    holder = leases.holder_of(worker, claim.message_id, claim.stream)
    if claim.task_id in running:
        return Taken(claim, holder, reclaimed, already_running=True)
    current = await leases.acquire(redis, claim.task_id, holder, lease_ms)
    if current is None:
        return Taken(claim, holder, reclaimed)
    if leases.origin_of(current) != (claim.stream, claim.message_id):
        # A duplicate: the holder has its own (ids are per stream, so both are compared).
        await queue.ack(redis, claim.message_id, claim.stream)
    return None


async def give_back(redis: Redis, taken: Taken) -> None:
    """Return a task taken but not started: a fresh message on the queue, lease dropped."""
    claim = taken.claim
    await leases.release(
        redis, taken.task_id, taken.holder, claim.message_id, requeue=True, stream=claim.stream
    )
