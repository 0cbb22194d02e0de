"""Gymnasium-like clients of `/v1/episodes` (docs/rl.md): `Env` (sync), `AsyncEnv`, and
`PackageEnv`, shaped like the paper's RL environment (reset/step/compute_final_reward/close).

Only HTTP: a trainer needs httpx and this module, nothing of the server.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx


class EpisodeError(Exception):
    """The API refused a call; `infrastructure` says the service, not the model, failed."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        error = body.get("error") or {}
        details = error.get("details") or {}
        super().__init__(f"{status}: {error.get('message', body)}")
        self.status = status
        self.code = str(error.get("code", ""))
        self.infrastructure = isinstance(details, dict) and (
            details.get("error_kind") == "infrastructure"
        )


@dataclass
class StepResult:
    messages: list[dict[str, Any]]
    """Append these after the assistant message just sent."""
    done: bool
    finish_reason: str | None = None
    infrastructure: bool = False
    """Ended by the service (a lost worker, a failed sandbox): mask it out of the loss."""
    info: dict[str, Any] = field(default_factory=dict)


def _json(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json() if response.content else {}
    if response.status_code >= 400:
        raise EpisodeError(response.status_code, body)
    return body


def _step_result(body: dict[str, Any]) -> StepResult:
    return StepResult(
        messages=body["messages"],
        done=body["done"],
        finish_reason=body.get("finish_reason"),
        infrastructure=body.get("error_kind") == "infrastructure",
        info={"timings": body.get("timings", {}), "error": body.get("error")},
    )


class AsyncEnv:
    """One environment: `reset` opens a new episode (closing the previous one)."""

    def __init__(self, client: httpx.AsyncClient, spec: dict[str, Any]) -> None:
        self.client, self.spec = client, spec
        self.id: str | None = None
        self.messages: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []

    async def reset(self) -> list[dict[str, Any]]:
        """The first messages (system, user); `tools` holds the schemas to offer."""
        await self.close()
        opened = _json(await self.client.post("/v1/episodes", json=self.spec))
        self.id, self.tools = opened["id"], opened["tools"]
        self.messages = list(opened["messages"])
        return list(opened["messages"])

    async def step(self, message: dict[str, Any]) -> StepResult:
        """Send the model's assistant message; `messages` keeps the whole conversation."""
        result = _step_result(
            _json(await self.client.post(f"/v1/episodes/{self.id}/step", json={"message": message}))
        )
        self.messages += [message, *result.messages]
        return result

    async def reward(self) -> float:
        score: float = _json(await self.client.post(f"/v1/episodes/{self.id}/reward"))["score"]
        return score

    async def close(self) -> None:
        if self.id is not None:
            _json(await self.client.delete(f"/v1/episodes/{self.id}"))
            self.id = None

    async def fork(self, n: int = 1) -> list[AsyncEnv]:
        """`n` environments that go on from this one's current step, each with a copy of
        its sandbox's files and its conversation so far (docs/fork.md); this one goes on."""
        body = _json(await self.client.post(f"/v1/episodes/{self.id}/fork", json={"n": n}))
        children: list[dict[str, Any]] = body["children"]
        if (error := _failure(children)) is not None:  # all of them or none: the rest closed
            for child in _started(children):
                _json(await self.client.delete(f"/v1/episodes/{child['id']}"))
            raise error
        return [_child(AsyncEnv(self.client, self.spec), opened) for opened in children]


class Env:
    """`AsyncEnv`, synchronously (one `httpx.Client`)."""

    def __init__(self, client: httpx.Client, spec: dict[str, Any]) -> None:
        self.client, self.spec = client, spec
        self.id: str | None = None
        self.messages: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []

    def reset(self) -> list[dict[str, Any]]:
        self.close()
        opened = _json(self.client.post("/v1/episodes", json=self.spec))
        self.id, self.tools = opened["id"], opened["tools"]
        self.messages = list(opened["messages"])
        return list(opened["messages"])

    def step(self, message: dict[str, Any]) -> StepResult:
        body = _json(self.client.post(f"/v1/episodes/{self.id}/step", json={"message": message}))
        result = _step_result(body)
        self.messages += [message, *result.messages]
        return result

    def reward(self) -> float:
        score: float = _json(self.client.post(f"/v1/episodes/{self.id}/reward"))["score"]
        return score

    def close(self) -> None:
        if self.id is not None:
            _json(self.client.delete(f"/v1/episodes/{self.id}"))
            self.id = None

    def fork(self, n: int = 1) -> list[Env]:
        """`AsyncEnv.fork`, synchronously."""
        body = _json(self.client.post(f"/v1/episodes/{self.id}/fork", json={"n": n}))
        children: list[dict[str, Any]] = body["children"]
        if (error := _failure(children)) is not None:
            for child in _started(children):
                _json(self.client.delete(f"/v1/episodes/{child['id']}"))
            raise error
        return [_child(Env(self.client, self.spec), opened) for opened in children]


AnyEnv = TypeVar("AnyEnv", AsyncEnv, Env)


def _started(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [child for child in children if child["status"] == "open"]


def _failure(children: list[dict[str, Any]]) -> EpisodeError | None:
    """A fork whose child could not start fails as a reset would (an infrastructure error)."""
    for child in children:
        if child["status"] != "open":
            message = f"fork child {child['id']} could not start: {child.get('error')}"
            details = {"error_kind": child.get("error_kind")}
            return EpisodeError(
                503, {"error": {"code": "unavailable", "message": message, "details": details}}
            )
    return None


def _child(env: AnyEnv, opened: dict[str, Any]) -> AnyEnv:
    """A fork's child as an environment of the parent's spec."""
    env.id, env.tools = opened["id"], opened["tools"]
    env.messages = list(opened["messages"])
    return env


class PackageEnv:
    """The paper's RL environment's shape: `reset() -> (task, info)`, `step(action) ->
    (observation, 0.0, done, info)` with `action` a tool call `{"name", "arguments"}` (or
    an assistant message), `compute_final_reward()`, `close()`."""

    def __init__(self, client: httpx.Client, spec: dict[str, Any]) -> None:
        self.env = Env(client, spec)
        self.turn = 0

    def reset(self) -> tuple[str, dict[str, Any]]:
        messages = self.env.reset()
        return str(self.env.spec["prompt"]), {"messages": messages, "tools": self.env.tools}

    def step(self, action: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        self.turn += 1
        message = action if action.get("role") == "assistant" else self._message(action)
        result = self.env.step(message)
        observation = "\n".join(str(m.get("content", "")) for m in result.messages)
        info = {**result.info, "finish_reason": result.finish_reason}
        return observation, 0.0, result.done, info

    def compute_final_reward(self) -> float:
        return self.env.reward()

    def close(self) -> None:
        self.env.close()

    @staticmethod
    def is_multithread_safe() -> bool:
        return True

    def _message(self, call: dict[str, Any]) -> dict[str, Any]:
        arguments = call.get("arguments", {})
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
        function = {"name": call["name"], "arguments": raw}
        tool_call = {"id": f"call_{self.turn}", "type": "function", "function": function}
        return {"role": "assistant", "content": "", "tool_calls": [tool_call]}


def http_client(url: str, key: str | None) -> httpx.Client:
    """A client of the service at `url` with API key `key`, patient enough for a step
    whose command runs long (the episode's own timeouts bound it)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=url, headers=headers, timeout=httpx.Timeout(1800.0))


def client_from_environment() -> httpx.Client:
    """`http_client` of `SANDHIVE_URL` and `SANDHIVE_API_KEY`, which a trainer's processes
    have when the training script passes the environment nothing else."""
    url = os.environ.get("SANDHIVE_URL")
    if not url:
        raise RuntimeError("set SANDHIVE_URL (and SANDHIVE_API_KEY) or pass a client")
    return http_client(url, os.environ.get("SANDHIVE_API_KEY"))
