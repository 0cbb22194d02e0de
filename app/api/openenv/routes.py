"""`/v1/openenv`: Sandhive's episodes as an OpenEnv environment (docs/rl.md), for OpenEnv's
own clients (`GenericEnvClient`, `MCPToolClient`) pointed at `http://<any>:<key>@host/v1/openenv`.

A WebSocket session (`/ws`) is one environment: `reset` opens an episode (closing the
session's previous one), `step` runs one action through `POST /v1/episodes/{id}/step`'s
service, `state` reads it, and `close` or a dropped connection closes it. The key is
checked at the handshake (Bearer, `?token=`, or the URL's password, which is how
OpenEnv's client, which sets no headers, can send one): a refusal is an HTTP 401/429
before the upgrade. Each message counts against the tenant's request rate, and
episodes keep their own limits, step timeouts and reaping.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from app import __version__
from app.api.deps import Tenant, current_tenant, within_rate
from app.api.errors import error_response
from app.api.openenv import protocol
from app.errors import AppError, Conflict, InvalidInput
from app.kit import outage
from app.resources import Resources
from app.schemas.episodes import RewardOut
from app.schemas.tasks import ErrorOut
from app.services.episodes import calls as episodes_calls
from app.services.episodes import reward as episodes_reward
from app.services.episodes import service as episodes

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/openenv", tags=["openenv"])
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorOut} for code in (401, 429)}


@router.get("/health", response_model=dict[str, str], responses=_ERRORS)
async def health(_tenant: Tenant) -> dict[str, str]:
    """OpenEnv's health check (the key is checked, as on every `/v1` route); the
    service's own readiness is `/readyz`."""
    return {"status": "healthy"}


@router.get("/metadata", response_model=dict[str, str], responses=_ERRORS)
async def metadata(_tenant: Tenant) -> dict[str, str]:
    """OpenEnv's environment metadata."""
    return {"name": protocol.NAME, "description": protocol.DESCRIPTION, "version": __version__}


@router.get("/schema", response_model=dict[str, Any], responses=_ERRORS)
async def schema(_tenant: Tenant) -> dict[str, Any]:
    """OpenEnv's action, observation and state JSON Schemas, and `reset`'s data."""
    return protocol.schemas()


@dataclass
class Session:
    """One WebSocket's environment: the tenant and its current episode."""

    res: Resources
    tenant: str
    episode_id: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    step_count: int = 0

    async def reset(self, data: dict[str, Any]) -> dict[str, Any]:
        body = protocol.ResetData.model_validate(data).episode()
        await self.close()
        res = self.res
        opened = await episodes_calls.open_episode(
            res.sessions, res.redis, res.settings, self.tenant, body
        )
        self.episode_id, self.tools, self.step_count = opened.id, opened.tools, 0
        return protocol.opened(opened)

    async def step(self, data: dict[str, Any]) -> dict[str, Any]:
        action = protocol.ACTION.validate_python(data)
        episode_id = self._current()
        if isinstance(action, protocol.ListTools):
            return protocol.listed(self.tools, episode_id, self.step_count)
        message = protocol.assistant_message(action, self.step_count)
        res = self.res
        out = await episodes_calls.step(
            res.sessions, res.redis, res.settings, self.tenant, episode_id, message
        )
        self.step_count += 1
        reward = await self._reward() if out.done and out.error_kind is None else None
        if out.done and out.error_kind is not None:
            reward = f"no reward: {out.error_kind} failure ({out.error})"
        return protocol.stepped(out, message, episode_id, self.step_count, reward)

    async def state(self) -> dict[str, Any]:
        if self.episode_id is None:
            return protocol.State(episode_id=None, step_count=0).model_dump()
        row = await episodes.find(self.res.sessions, self.tenant, self.episode_id)
        state = protocol.State(
            episode_id=row.id,
            step_count=self.step_count,
            status=row.status,
            finish_reason=row.finish_reason,
        )
        return state.model_dump()

    async def close(self) -> None:
        episode_id, self.episode_id = self.episode_id, None
        if episode_id is not None:
            res = self.res
            await episodes_calls.close(
                res.sessions, res.redis, res.settings, self.tenant, episode_id
            )

    async def _reward(self) -> RewardOut | str | None:
        """The scorer's reward at done; the reason instead when there is none to give (the
        step has run: its observation is answered whatever the reward's fate)."""
        res = self.res
        try:
            row = await episodes.find(res.sessions, self.tenant, self._current())
            if row.scorer is None:
                return None
            return await episodes_reward.reward(res.sessions, res.redis, res.settings, row)
        except AppError as exc:
            return f"no reward: {exc.message}"
        except Exception as exc:
            log.warning("openenv: the reward of %s failed: %r", self.episode_id, exc)
            name = type(exc).__name__
            return f"no reward: the service failed ({name}); POST /v1/episodes/{{id}}/reward again"

    def _current(self) -> str:
        if self.episode_id is None:
            raise Conflict("no episode in this session: send reset first")
        return self.episode_id


@router.websocket("/ws")
async def session(ws: WebSocket) -> None:
    res: Resources = ws.state.res
    try:
        tenant = await current_tenant(ws, res)
    except AppError as exc:  # refused before the upgrade: the client sees the HTTP status
        denial = error_response(
            exc.status, exc.code, exc.message, exc.details, exc.headers() or None
        )
        await ws.send_denial_response(denial)
        return
    await ws.accept()
    env = Session(res, tenant)
    try:
        while (received := await ws.receive())["type"] != "websocket.disconnect":
            raw = received.get("text") or (received.get("bytes") or b"").decode(errors="replace")
            reply = await _answer(env, raw)
            if reply is None:
                break
            await ws.send_text(json.dumps(reply))
    except WebSocketDisconnect:
        pass
    finally:
        try:
            await env.close()
        except Exception as exc:  # its idle timeout and the sweep end it anyway
            log.warning("openenv: could not close episode on session end: %r", exc)
        with contextlib.suppress(RuntimeError, OSError):
            await ws.close()


async def _answer(env: Session, raw: str) -> dict[str, Any] | None:
    """The reply to one message; None for `close`. Whatever fails is an error reply and the
    session goes on (a trainer keeps its episode through a backend's blip)."""
    parsed = _parse(raw)
    if not isinstance(parsed, tuple):
        return parsed
    kind, data = parsed
    if kind == "close":
        return None
    try:
        await within_rate(env.res, env.tenant)
        return await _dispatch(env, kind, data)
    except ValidationError as exc:
        errors = json.loads(exc.json(include_url=False, include_context=False))
        return _error("VALIDATION_ERROR", "Invalid message", errors=errors)
    except AppError as exc:
        return _refused(exc)
    except Exception as exc:
        down = outage.unavailable(exc, env.res.settings.unavailable_retry_after_s)
        if down is not None:
            return _refused(down)
        log.exception("openenv: a %s message failed", kind)
        return _error("EXECUTION_ERROR", f"the service failed: {type(exc).__name__}", status=500)


def _parse(raw: str) -> tuple[object, dict[str, Any]] | dict[str, Any]:
    """(type, data) of a message, or the error reply to it."""
    try:
        message = json.loads(raw)
    except ValueError as exc:
        return _error("INVALID_JSON", f"Invalid JSON: {exc}")
    if not isinstance(message, dict):
        return _error("INVALID_JSON", "a message is a JSON object with a `type`")
    data = message.get("data") or {}
    if not isinstance(data, dict):
        return _refused(InvalidInput("`data` must be a JSON object"))
    return message.get("type"), data


async def _dispatch(env: Session, kind: object, data: dict[str, Any]) -> dict[str, Any]:
    match kind:
        case "reset":
            return {"type": "observation", "data": await env.reset(data)}
        case "step":
            return {"type": "observation", "data": await env.step(data)}
        case "state":
            return {"type": "state", "data": await env.state()}
    return _error("UNKNOWN_TYPE", f"Unknown message type: {kind}")


def _refused(exc: AppError) -> dict[str, Any]:
    details = {"status": exc.status, "error_code": exc.code, "details": exc.details}
    return _error("EXECUTION_ERROR", exc.message, **details)


def _error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}
