"""The worker's channel to the proxy: newline-delimited JSON over a Unix socket.

Worker -> proxy: `{"id": n, "op": "grant", ...Grant fields}` and `{"id": n, "op": "revoke",
"key": ...}`, each answered `{"id": n, "ok": true}` (or `false` with an `error`).
Proxy -> worker: `{"event": "blocked", "task", "attempt", "host", "reason", "count"}` for
refused connections of a grant that worker made, within the grant's report budget (the
rest are counted into the next one's `count`), dropped while the worker reads too slowly.
Grants belong to the connection that made them: when a worker goes away its grants go
with it (fail closed); a worker that reconnects sends its live grants again.
The socket lives in a directory only the proxy's user (and root, the worker) can reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from . import rules
from .proxy import MAX_OPEN_TOTAL, Grant, Proxy

log = logging.getLogger("egress.control")
BACKLOG = 2**20
"""Bytes of unread reports past which more reports to that worker are dropped."""


class Control:
    """Serves the control socket; routes each grant's refusals back to its worker."""

    def __init__(self, max_open: int = MAX_OPEN_TOTAL) -> None:
        self.proxy = Proxy(self._report, max_open=max_open)
        self._owners: dict[str, asyncio.StreamWriter] = {}

    def _report(self, grant: Grant, host: str, reason: str) -> None:
        log.info("blocked task=%s host=%s: %s", grant.task, host, reason)
        owner = self._owners.get(grant.key)
        if owner is None or owner.transport.get_write_buffer_size() > BACKLOG:
            return
        count, grant.counted = max(1, grant.refusals - grant.counted), grant.refusals
        event = {"event": "blocked", "task": grant.task, "attempt": grant.attempt, "count": count}
        with contextlib.suppress(OSError, RuntimeError):
            owner.write(_line({**event, "host": host, "reason": reason}))

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        keys: set[str] = set()
        try:
            while line := await reader.readline():
                reply = self._apply(json.loads(line), writer, keys)
                writer.write(_line(reply))
                await writer.drain()
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            log.warning("control connection ended: %r", exc)
        finally:
            for key in keys:
                if self._owners.get(key) is writer:
                    self._owners.pop(key, None)
                    self.proxy.revoke(key)
            writer.close()

    def _apply(
        self, msg: dict[str, Any], writer: asyncio.StreamWriter, keys: set[str]
    ) -> dict[str, Any]:
        reply: dict[str, Any] = {"id": msg.get("id")}
        try:
            if msg["op"] == "grant":
                grant = grant_of(msg)
                self.proxy.revoke(grant.key)  # a stale grant on a reused address goes first
                self.proxy.grants[grant.key] = grant
                self._owners[grant.key] = writer
                keys.add(grant.key)
            elif msg["op"] == "revoke":
                self.proxy.revoke(str(msg["key"]))
                self._owners.pop(str(msg["key"]), None)
                keys.discard(str(msg["key"]))
            else:
                raise ValueError(f"unknown op {msg['op']!r}")
        except (KeyError, TypeError, ValueError) as exc:
            return {**reply, "ok": False, "error": repr(exc)}
        return {**reply, "ok": True}


def grant_of(msg: dict[str, Any]) -> Grant:
    """A Grant from its control message; ValueError/KeyError when malformed."""
    return Grant(
        key=str(msg["key"]),
        task=str(msg["task"]),
        attempt=int(msg["attempt"]),
        allow=tuple(rules.normalize_pattern(p) for p in msg["allow"]),
        max_connections=int(msg["max_connections"]),
        max_bytes=int(msg["max_bytes"]),
        ports=frozenset(int(p) for p in msg["ports"]),
        exempt=rules.parse_networks(msg.get("exempt", [])),
        service=rules.parse_networks(msg.get("service", [])),
        hosts={rules.normalize_name(k): str(v) for k, v in msg.get("hosts", {}).items()},
        peers=rules.parse_networks([msg["subnet"]]),
        max_open=int(msg.get("max_open", 256)),
        max_refusals=int(msg.get("max_refusals", 1000)),
    )


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"
