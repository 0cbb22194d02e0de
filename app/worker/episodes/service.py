"""The worker's episode service: open episodes claimed from the shared stream, then serve
their step and close requests from this worker's own list, and reap the idle ones.

Every request is answered exactly once, on its reply key. Requests of one episode run
one at a time (its lock); different episodes' run side by side. The row is written
before the answer when the episode ends, so what the API reads after an answer is already
true (a deferred scorer's reward included, `app.worker.episodes.reward`); open episodes'
step counts are written after it, about once a second, all at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import nullcontext, suppress
from typing import Any

from redis.exceptions import RedisError

from app.agent.types import Step
from app.bus import episodes as bus
from app.errors import SandboxError
from app.sandbox.snapshot import SnapshotTooLarge
from app.services.episodes import counts as episodes_counts
from app.services.episodes import service as rows
from app.worker.context import WorkerContext
from app.worker.episodes.live import ForkPoint, LiveEpisode
from app.worker.episodes.reward import needs_scoring, score_ended, scoring_lease

log = logging.getLogger(__name__)
BLOCK_MS = 200
PAUSE_S = 1.0
STEPS_EVERY_S = 1.0


class EpisodeServer:
    def __init__(
        self,
        ctx: WorkerContext,
        stopping: asyncio.Event,
        images: Callable[[], Collection[str]] | None = None,
    ) -> None:
        self.ctx, self.stopping = ctx, stopping
        self.images = images
        """The catalogue images this worker's daemon has (None: do not check)."""
        self.halted = asyncio.Event()
        self.live: dict[str, LiveEpisode] = {}
        self.counts: dict[str, int] = {}
        """Open episodes' step counts not written yet (`_write_counts`)."""
        self.opening = 0
        self.closing = 0
        self.scoring = 0
        """Ended episodes whose deferred scorer runs: they hold their slot until it is done."""
        self.told_free: int | None = None
        """The free slots last told to the API (`app.bus.episodes.tell_free`), and when."""
        self.told_at = 0.0

    def halt(self) -> None:
        """Stop serving even though the worker's own stop was not asked (a burst's end)."""
        self.halted.set()

    async def serve(self) -> None:
        """Until the worker stops; then every episode it holds is closed (sandbox removed)."""
        if self.ctx.settings.episode_slots == 0:
            return
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._loop("open", lambda: self._open_one(group)))
                group.create_task(self._loop("requests", lambda: self._serve_one(group)))
                group.create_task(self._loop("idle", self._reap_idle))
                group.create_task(self._loop("counts", self._write_counts))
        finally:
            for episode in list(self.live.values()):
                await self._close(episode, "closed", "worker_stopped", "infrastructure")

    async def _loop(self, name: str, once: Any) -> None:
        while not (self.stopping.is_set() or self.halted.is_set()):
            try:
                await once()
            except (RedisError, OSError) as exc:
                log.warning("episodes (%s): lost touch with Redis: %r", name, exc)
                await self._pause(PAUSE_S)
            except Exception:
                log.exception("episodes (%s) failed", name)
                await self._pause(PAUSE_S)

    def _held(self) -> int:
        """Slots in use: open, opening, closing, scoring, and ended episodes whose sandboxes
        are still being removed (in the background, after the final step answered)."""
        held = len(self.live) + self.opening + self.closing + self.scoring
        return held + self.ctx.runner.removing

    async def _closing(self, episode: LiveEpisode) -> None:
        """`episode.close()` (its loop ended, its output collected, its removal begun),
        its slot held until then: the container exists until its removal is counted."""
        self.closing += 1
        try:
            await episode.close()
        finally:
            self.closing -= 1

    async def _open_one(self, group: asyncio.TaskGroup) -> None:
        await self._tell_free()
        if self._held() >= self.ctx.settings.episode_slots:
            await asyncio.sleep(BLOCK_MS / 1000)
            return
        request = await bus.claim_open(self.ctx.redis, self.ctx.name, block_ms=BLOCK_MS)
        if request is None:
            return
        elsewhere = self.images is not None and request.image not in self.images()
        if elsewhere or self._held() >= self.ctx.settings.episode_slots:
            # Not here: another worker that has the image (the API answers 503 at once when
            # no live worker has it) or a free slot (a fork took the last ones while this
            # waited for a request) takes it; the open timeout bounds the rest.
            await self._pause(BLOCK_MS / 1000)
            if not await bus.reopen(self.ctx.redis, request):
                log.info("open request of %s expired unserved", request.episode_id)
            return
        self.opening += 1
        group.create_task(self._open(request))

    async def _open(self, request: bus.OpenRequest) -> None:
        await self._answer(request.reply, await self._start(request.episode_id))

    async def _start(self, episode_id: str, fork: ForkPoint | None = None) -> dict[str, Any]:
        """Take the `opening` episode and start it (a fork's child: from `fork`); the reply
        to whoever asked. Counted in `self.opening` by the caller until it is in `self.live`."""
        counted = True  # in `self.opening` until it is in `self.live`: one slot, never two
        try:
            step = None if fork is None else fork.index
            opening = await rows.assign(self.ctx.sessions, episode_id, self.ctx.name, step)
            if opening is None:  # ended (the API gave up) before a worker got to it
                return {"failure": "episode ended"}
            episode = LiveEpisode(self.ctx.runner, opening, self.ctx.name, self.ctx.instance, fork)
            self.live[episode.id] = episode
            self.opening, counted = self.opening - 1, False
            async with episode.lock:
                reply = await episode.start()
                if reply["done"]:
                    await self._finish(episode, reply)
            return reply
        except Exception as exc:
            log.exception("could not open episode %s", episode_id)
            if (started := self.live.pop(episode_id, None)) is not None:
                with suppress(Exception):  # its slot freed, whatever of its sandbox started
                    await self._closing(started)
            try:
                await rows.end(
                    self.ctx.sessions,
                    episode_id,
                    status="done",
                    finish_reason="sandbox_error",
                    error=f"could not open the episode: {exc!r}",
                    error_kind=rows.INFRASTRUCTURE,
                )
            except Exception:  # not raised in a TaskGroup child: the API ends it on its call
                log.exception("could not end episode %s", episode_id)
            return {"failure": "could not open"}
        finally:
            if counted:
                self.opening -= 1

    async def _fork(self, parent: LiveEpisode, children: list[str]) -> dict[str, Any]:
        """Start `children` (rows the API made, `opening`) from the parent as it is now: its
        snapshot is taken under its lock (it pauses for it, then goes on); every child holds
        a slot of this worker, where the snapshot is."""
        s = self.ctx.settings
        free = s.episode_slots - self._held()
        if len(children) > free:
            return {
                "refused": f"this worker has {max(free, 0)} episode slots free, the fork asked"
                f" for {len(children)} (SANDHIVE_EPISODE_SLOTS is {s.episode_slots})",
                "status": 429,
                "details": {"limit": "episode_slots", "free": max(free, 0), "asked": len(children)},
            }
        self.opening += len(children)  # held from now on: a second fork cannot take them too
        starting = 0
        try:
            started = time.monotonic()
            async with parent.lock:
                if parent.done:
                    return {"refused": "the episode is done", "status": 409}
                try:
                    point = await parent.fork_point(s.fork_max_snapshot_mb * 2**20)
                except SandboxError as exc:
                    if parent.done or parent.id not in self.live:  # closed while it was read
                        return {"refused": "the episode ended during its snapshot", "status": 409}
                    if not isinstance(exc, SnapshotTooLarge):
                        raise
                    return {
                        "refused": f"{exc.message} (SANDHIVE_FORK_MAX_SNAPSHOT_MB is"
                        f" {s.fork_max_snapshot_mb}): nothing was started",
                        "status": 422,
                        "details": {
                            "limit": "fork_max_snapshot_mb",
                            "value": s.fork_max_snapshot_mb,
                        },
                    }
            snapshot_ms = int((time.monotonic() - started) * 1000)
            starting = len(children)  # from here `_start` uncounts each child itself
            replies = await asyncio.gather(*(self._start(child, point) for child in children))
        finally:
            self.opening -= len(children) - starting
        return {
            "step": point.index,
            "children": dict(zip(children, replies, strict=True)),
            "timings": {
                "snapshot_ms": snapshot_ms,
                "snapshot_bytes": len(point.files),
                "worker_ms": int((time.monotonic() - started) * 1000),
            },
        }

    async def _tell_free(self) -> None:
        """Tell the API how many episodes it may still open here when that changed (and
        every few seconds, so it does not lapse): an open that no worker has room for is
        then a 429 at once, not a wait for the open timeout."""
        s = self.ctx.settings
        free = max(0, s.episode_slots - self._held())
        now = time.monotonic()
        if free == self.told_free and now - self.told_at < s.worker_heartbeat_s:
            return
        await bus.tell_free(self.ctx.redis, self.ctx.name, free, s.worker_lease_s)
        self.told_free, self.told_at = free, now

    async def _serve_one(self, group: asyncio.TaskGroup) -> None:
        request = await bus.next_request(self.ctx.redis, self.ctx.name, timeout_s=BLOCK_MS / 1000)
        if request is not None:
            group.create_task(self._handle(request))

    async def _handle(self, request: dict[str, Any]) -> None:
        reply_key = str(request["reply"])
        episode = self.live.get(str(request.get("episode_id")))
        if episode is None:
            await self._answer(reply_key, {"failure": "unknown episode"})
            return
        try:
            if request.get("op") == "close":
                await self._close(episode, "closed", "closed", None)
                reply: dict[str, Any] = {"closed": True}
            elif request.get("op") == "fork":
                reply = await self._fork(episode, [str(c) for c in request["children"]])
            else:
                reply = await self._step(episode, request.get("message"))
        except Exception as exc:
            log.exception("episode %s: request failed", episode.id)
            reply = {"failure": f"the worker failed: {exc!r}"}
        await self._answer(reply_key, reply)
        if reply.get("done") is False:
            self.counts[episode.id] = len(episode.outcome.steps)

    async def _answer(self, reply_key: str, payload: dict[str, Any]) -> None:
        """Answer a request; a failure is logged, never raised: raised in a TaskGroup child,
        it would cancel every sibling (the other episodes' steps and scorings) and stop this
        server. The API, with no answer, ends the episode or reads how it ended."""
        try:
            await bus.answer(self.ctx.redis, reply_key, payload)
        except (RedisError, OSError) as exc:
            log.warning("could not answer %s: %r", reply_key, exc)

    async def _write_counts(self) -> None:
        """Every `STEPS_EVERY_S`, the step counts that changed, in one transaction
        (`services.episodes_counts`: not one Postgres transaction per step)."""
        await self._pause(STEPS_EVERY_S)
        counts, self.counts = self.counts, {}
        await episodes_counts.record_steps(self.ctx.sessions, counts)

    async def _step(self, episode: LiveEpisode, message: object) -> dict[str, Any]:
        if not isinstance(message, dict):
            return {"invalid": "message must be a JSON object"}
        async with episode.lock:
            if episode.done:
                return {"conflict": "the episode is done"}
            try:
                reply = await episode.step(message)
            except (TypeError, ValueError, KeyError) as exc:
                return {"invalid": f"not an assistant message: {exc}"}
            if reply["done"]:
                await self._finish(episode, reply)
            return reply

    async def _finish(self, episode: LiveEpisode, reply: dict[str, Any]) -> None:
        """The loop ended: the row says so (with the answer) before anyone is told; then a
        deferred scorer (`llm_judge`, `python`) runs and its result is stored, so the final
        step's answer means the reward is ready (other episodes step meanwhile). Its scoring
        lease is taken before the row says `done`: no moment shows a submitted answer with
        neither a reward nor a scorer behind it."""
        answer = episode.answer(self.ctx.settings.answer_max_bytes)
        reason = str(reply["finish_reason"])
        scored = needs_scoring(
            self.ctx.settings, episode.opening, reason, answer, reply.get("error_kind")
        )
        async with scoring_lease(self.ctx, episode.id) if scored else nullcontext():
            ended = await rows.end(
                self.ctx.sessions,
                episode.id,
                status="done",
                finish_reason=reason,
                error=reply.get("error"),
                error_kind=reply.get("error_kind"),
                answer=answer,
                steps=len(episode.outcome.steps),
                trajectory=stored_steps(episode.outcome.steps),
            )
            self.live.pop(episode.id, None)
            self.counts.pop(episode.id, None)
            if ended and scored:
                assert answer is not None
                await self._score(episode.opening, answer, reply)

    async def _score(self, opening: rows.Opening, answer: str, reply: dict[str, Any]) -> None:
        """Run the deferred scorer (its episode slot held meanwhile); its time in the
        final step's timings."""
        self.scoring += 1
        started = time.monotonic()
        try:
            await score_ended(self.ctx, opening, answer)
        finally:
            self.scoring -= 1
        if "timings" in reply:  # the step's whole time in the worker includes the scoring
            score_ms = int((time.monotonic() - started) * 1000)
            reply["timings"]["score_ms"] = score_ms
            reply["timings"]["worker_ms"] += score_ms

    async def _close(
        self, episode: LiveEpisode, status: str, reason: str, error_kind: str | None
    ) -> None:
        self.live.pop(episode.id, None)
        self.counts.pop(episode.id, None)
        await self._closing(episode)
        with suppress(Exception):
            await rows.end(
                self.ctx.sessions,
                episode.id,
                status=status,
                finish_reason=reason,
                error=None if error_kind is None else f"the episode was {reason.replace('_', ' ')}",
                error_kind=error_kind,
                answer=episode.answer(self.ctx.settings.answer_max_bytes),
                steps=len(episode.outcome.steps),
                trajectory=stored_steps(episode.outcome.steps),
            )

    async def _pause(self, seconds: float) -> None:
        """Sleep, but no longer than until the worker stops (an idle worker exits at once)."""
        waits = [asyncio.ensure_future(e.wait()) for e in (self.stopping, self.halted)]
        try:
            await asyncio.wait(waits, timeout=seconds)
        finally:
            for waiting in waits:
                waiting.cancel()

    async def _reap_idle(self) -> None:
        await self._pause(PAUSE_S)
        idle_s = self.ctx.settings.episode_idle_timeout_s
        now = time.monotonic()
        for episode in list(self.live.values()):
            if now - episode.last_active > idle_s and not episode.lock.locked():
                log.info("episode %s idle for %.0f s: closed", episode.id, idle_s)
                await self._close(episode, "closed", "idle", None)


def stored_steps(steps: Sequence[Step]) -> list[dict[str, Any]]:
    """An episode's steps as `EpisodeRow.trajectory` keeps them: the columns a task's
    `steps` rows have (the trainer's model turns are its own: their text, not their ids)."""
    return [
        {
            "index": step.index,
            "started_at": step.started_at.isoformat(),
            "thought": step.thought,
            "reasoning": step.reasoning,
            "action": (
                {"tool": step.action.tool, "arguments": step.action.arguments}
                if step.action is not None
                else None
            ),
            "observation": step.observation,
            "exit_code": step.exit_code,
            "llm_ms": step.llm_ms,
            "tool_ms": step.tool_ms,
            "prompt_tokens": step.prompt_tokens,
            "completion_tokens": step.completion_tokens,
            "interrupted": step.interrupted,
        }
        for step in steps
    ]
