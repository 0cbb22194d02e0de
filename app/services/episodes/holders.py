"""The open episodes this API process has stepped, kept in memory: a step reads no row.

An open episode's tenant and worker never change once a worker took it, so after the
first step's read the row is not read again: reading it was a third of the API's time
per step with 128 episodes stepping (bench/episodes.py). What the cache cannot know, that
the episode ended meanwhile (its loop ended, it was closed or reaped, through another
API process too), the worker says: it answers "unknown episode" for one it no longer
holds, and `episodes_calls` then reads the row and answers 409. An episode whose worker
died is refused by the send itself (no heartbeat: 503, then forgotten here).
Every refusal, end and close forgets the episode here; the cache is bounded.
"""

from __future__ import annotations

from collections import OrderedDict

from app.db import models
from app.db.engine import Sessions
from app.services.episodes import service as rows

MAX_HELD = 10_000
"""Episodes kept per API process (least recently stepped dropped first: read again)."""


class Holders:
    def __init__(self, size: int = MAX_HELD) -> None:
        self.size = size
        self._rows: OrderedDict[str, models.EpisodeRow] = OrderedDict()

    async def find(self, sessions: Sessions, tenant: str, episode_id: str) -> models.EpisodeRow:
        """The tenant's episode, from memory while it is known open, else its row (404 for
        another tenant's, as `episodes.find`)."""
        row = self._rows.get(episode_id)
        if row is not None and row.tenant_id == tenant:
            self._rows.move_to_end(episode_id)
            return row
        row = await rows.find(sessions, tenant, episode_id)
        if row.status == "open" and row.worker is not None:
            self._rows[episode_id] = row
            while len(self._rows) > self.size:
                self._rows.popitem(last=False)
        return row

    def forget(self, episode_id: str) -> None:
        self._rows.pop(episode_id, None)

    def remembers(self, episode_id: str) -> bool:
        return episode_id in self._rows


HOLDERS = Holders()
"""This process's: an episode id names one episode in every deployment (a ULID), so one
cache serves every app a process builds (tests build several)."""
