"""`sandhive mcp`: Sandhive's task API as MCP tools, so an agent can delegate work to a sandbox.

A client of the HTTP API like any other service (httpx, never app.db or app.services: an
import-linter contract keeps it so), so it runs anywhere the API is reachable and every
call is authorised by the API itself. The key: on stdio, the one it was started with
(`--api-key` / `SANDHIVE_API_KEY`); over streamable HTTP, each request's own bearer token,
passed through unchanged, so one MCP endpoint never lends one tenant's key to another.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import quote

import httpx
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import BlobResourceContents, EmbeddedResource, TextContent, ToolAnnotations
from pydantic import Field, model_validator

from app import __version__

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
POLL_S = 0.5
CANCEL_WAIT_S = 15.0
"""How long cancel_task waits for the task to be `cancelled` before answering."""
HTTP_TIMEOUT_S = 30.0
MAX_WAIT_S = 3600
DEFAULT_WAIT_S = 600
# A trajectory can be megabytes of tool output; more than this would drown a model's context.
DEFAULT_TRAJECTORY_CHARS = 40_000
TEXT_TYPES = ("text/", "application/json", "application/xml", "application/x-ndjson")

Transport = Literal["stdio", "http"]
TaskId = Annotated[str, Field(description="The task's id (`tsk_...`), as submit_task returned it.")]


@dataclass(frozen=True)
class Upstream:
    """Where the Sandhive API is, and the key stdio calls it with (None over HTTP)."""

    url: str
    api_key: str | None
    transport: Transport


def _bearer(headers: Mapping[str, str]) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def _key(upstream: Upstream, ctx: Context) -> str | None:
    """Over HTTP only the caller's own bearer token; a configured key is never lent out."""
    if upstream.transport == "stdio":
        return upstream.api_key
    headers = ctx.headers
    token = _bearer(headers) if headers is not None else None
    if token is None:
        raise ToolError("no API key: send `Authorization: Bearer <Sandhive API key>`")
    return token


def _explain(response: httpx.Response) -> str:
    """Sandhive's error shape in one line a model can act on."""
    try:
        error = response.json()["error"]
        message = f"{error['code']}: {error['message']}"
        if error.get("details"):
            message += f" ({json.dumps(error['details'])[:500]})"
    except (ValueError, KeyError, TypeError):
        message = response.text[:500] or response.reason_phrase
    if response.status_code == 401:
        return (
            f"Sandhive rejected the API key (401 {message}): the MCP server's user must give it"
            " a valid Sandhive key (stdio: SANDHIVE_API_KEY; HTTP: the bearer token)"
        )
    return f"Sandhive answered {response.status_code} {message}"


class Api:
    """One tool call's view of the Sandhive API: every failure becomes a ToolError."""

    def __init__(self, upstream: Upstream, key: str | None) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._url = upstream.url.rstrip("/")
        self._client = httpx.AsyncClient(
            base_url=self._url, headers=headers, timeout=HTTP_TIMEOUT_S
        )

    async def __aenter__(self) -> Api:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._client.aclose()

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ToolError(f"cannot reach Sandhive at {self._url}: {exc}") from exc
        if response.status_code >= 400:
            raise ToolError(_explain(response))
        return response

    async def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = await self.request(method, path, **kwargs)
        try:
            body = response.json()
        except ValueError as exc:
            raise ToolError(f"{self._url} answered something that is not Sandhive's API") from exc
        if not isinstance(body, dict):
            raise ToolError(f"{self._url} answered something that is not Sandhive's API")
        return body


def _summary(task: dict[str, Any]) -> dict[str, Any]:
    """What a model needs of a task; the full resolved spec would only cost it context."""
    keep = ("id", "status", "finish_reason", "answer", "error", "created_at", "finished_at")
    out = {k: task.get(k) for k in keep}
    out["steps"] = (task.get("usage") or {}).get("steps")
    return out


def _body(
    prompt: str,
    profile: str | None,
    model: str | None,
    max_steps: int | None,
    timeout_s: int | None,
) -> dict[str, Any]:
    llm = {k: v for k, v in (("profile", profile), ("model", model)) if v}
    limits = {k: v for k, v in (("max_steps", max_steps), ("timeout_s", timeout_s)) if v}
    return {"prompt": prompt, "llm": llm, "limits": limits}


def _idempotency(key: str | None) -> dict[str, str]:
    """A model's retry of a tool call after a lost answer must not start a second task."""
    return {"Idempotency-Key": key} if key else {}


def _task_path(task_id: str, rest: str = "") -> str:
    return f"/v1/tasks/{quote(task_id, safe='')}{rest}"


def _artifact_path(task_id: str, path: str) -> str:
    return _task_path(task_id, f"/artifacts/{quote(path.lstrip('/'), safe='/')}")


def _is_text(content_type: str) -> bool:
    base = content_type.split(";", 1)[0].strip().lower()
    return base.startswith(TEXT_TYPES) or base.endswith(("+json", "+xml"))


Prompt = Annotated[str, Field(description="The problem for the agent, in plain words.")]
Profile = Annotated[
    str | None, Field(description="A server LLM profile name; omit for the server's default.")
]
Model = Annotated[
    str | None, Field(description="A model the profile allows; omit for its default.")
]
MaxSteps = Annotated[
    int | None, Field(ge=1, description="Model turns before it stops; omit for the default.")
]
TimeoutS = Annotated[
    int | None, Field(ge=1, description="Wall-clock seconds for the task; omit for the default.")
]
WaitS = Annotated[
    int, Field(ge=1, le=MAX_WAIT_S, description="Seconds to wait for the end before returning.")
]
MaxChars = Annotated[int, Field(ge=1000, le=1_000_000, description="Most characters to return.")]
ArtifactPath = Annotated[str, Field(description="The file's path, as list_artifacts gave it.")]
IdempotencyKey = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=255,
        description=(
            "Any string unique to this request: retrying the call with the same key gives "
            "the same task back instead of starting a second one."
        ),
    ),
]

RUN_TASK = """Run a task in a fresh Sandhive sandbox and wait for it to finish.

An agent with a Linux shell, a file editor and Python works on `prompt` inside a
disposable Docker container, then submits an answer. Use it for work that needs code to
be run: computing, data processing, testing a snippet, producing files.

Returns the task id, its status (`succeeded`, `failed`, `cancelled`, or still `running`
when `wait_s` ran out: then call get_task later), the finish reason (`submitted`,
`max_steps`, `timeout`, ...), the answer text, any error, and the list of artifact files
(read one with read_artifact)."""

SUBMIT_TASK = """Queue a task in a fresh Sandhive sandbox and return at once, without waiting.

Use it instead of run_task for long work, or to start several tasks in parallel; then
poll get_task. Returns the task id and its status (`queued`)."""

GET_TASK = """The current state of a task: status (`queued`, `running`, `succeeded`,
`failed`, `cancelled`), finish reason, the answer once it has one, any error, steps so far."""

GET_TRAJECTORY = """What the agent of a task did, step by step: each step's thought, its
tool call and the tool's output. Use it to see how an answer was reached or why a task
failed. Long output is cut to `max_chars` characters (the newest steps are kept)."""

LIST_ARTIFACTS = """The files a task left in its output directory: path, size in bytes,
media type. Read one with read_artifact."""

READ_ARTIFACT = """One file a task produced, by its path from list_artifacts. Text comes
back as text; a binary file (image, archive, ...) as an embedded resource with its bytes
base64-encoded and its media type."""

CANCEL_TASK = """Stop a queued or running task (its sandbox is removed within seconds).
Returns its state; cancelling a task that already finished is an error saying so."""

_READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)


class Tools:
    """The tools' bodies: each a few API calls under the caller's key."""

    def __init__(self, upstream: Upstream) -> None:
        self._upstream = upstream

    def _api(self, ctx: Context) -> Api:
        return Api(self._upstream, _key(self._upstream, ctx))

    async def run_task(
        self,
        prompt: Prompt,
        ctx: Context,
        profile: Profile = None,
        model: Model = None,
        max_steps: MaxSteps = None,
        timeout_s: TimeoutS = None,
        wait_s: WaitS = DEFAULT_WAIT_S,
        idempotency_key: IdempotencyKey = None,
    ) -> dict[str, Any]:
        async with self._api(ctx) as sandhive:
            body = _body(prompt, profile, model, max_steps, timeout_s)
            task = await sandhive.json(
                "POST", "/v1/tasks", json=body, headers=_idempotency(idempotency_key)
            )
            task = await _wait(sandhive, task, wait_s, ctx)
            out = _summary(task)
            if task["status"] not in TERMINAL:
                out["note"] = f"still {task['status']} after {wait_s} s: call get_task later"
            else:
                listed = await sandhive.json("GET", _task_path(task["id"], "/artifacts"))
                out["artifacts"] = [_artifact(a) for a in listed["items"]]
            return out

    async def submit_task(
        self,
        prompt: Prompt,
        ctx: Context,
        profile: Profile = None,
        model: Model = None,
        max_steps: MaxSteps = None,
        timeout_s: TimeoutS = None,
        idempotency_key: IdempotencyKey = None,
    ) -> dict[str, Any]:
        async with self._api(ctx) as sandhive:
            body = _body(prompt, profile, model, max_steps, timeout_s)
            headers = _idempotency(idempotency_key)
            return _summary(await sandhive.json("POST", "/v1/tasks", json=body, headers=headers))

    async def get_task(self, task_id: TaskId, ctx: Context) -> dict[str, Any]:
        async with self._api(ctx) as sandhive:
            return _summary(await sandhive.json("GET", _task_path(task_id)))

    async def get_trajectory(
        self, task_id: TaskId, ctx: Context, max_chars: MaxChars = DEFAULT_TRAJECTORY_CHARS
    ) -> str:
        async with self._api(ctx) as sandhive:
            steps = (await sandhive.json("GET", _task_path(task_id, "/trajectory")))["steps"]
        return _fit_steps(steps, max_chars)

    async def list_artifacts(self, task_id: TaskId, ctx: Context) -> dict[str, Any]:
        async with self._api(ctx) as sandhive:
            listed = await sandhive.json("GET", _task_path(task_id, "/artifacts"))
        return {"artifacts": [_artifact(a) for a in listed["items"]], "skipped": listed["skipped"]}

    async def read_artifact(
        self, task_id: TaskId, path: ArtifactPath, ctx: Context
    ) -> TextContent | EmbeddedResource:
        async with self._api(ctx) as sandhive:
            response = await sandhive.request("GET", _artifact_path(task_id, path))
        content_type = response.headers.get("content-type", "application/octet-stream")
        if _is_text(content_type):
            try:
                return TextContent(type="text", text=response.content.decode("utf-8"))
            except UnicodeDecodeError:
                pass
        blob = BlobResourceContents(
            uri=f"sandhive://tasks/{task_id}/artifacts/{path.lstrip('/')}",
            mime_type=content_type,
            blob=base64.b64encode(response.content).decode(),
        )
        return EmbeddedResource(type="resource", resource=blob)

    async def cancel_task(self, task_id: TaskId, ctx: Context) -> dict[str, Any]:
        async with self._api(ctx) as sandhive:
            task = await sandhive.json("POST", _task_path(task_id, "/cancel"))
            # The API records the cancel and answers 202 at once; the task is `cancelled`
            # once its worker has stopped it (within seconds). Answer that state.
            deadline = time.monotonic() + CANCEL_WAIT_S
            while task["status"] not in TERMINAL and time.monotonic() < deadline:
                await asyncio.sleep(POLL_S)
                task = await sandhive.json("GET", _task_path(task_id))
            out = _summary(task)
            if task["status"] not in TERMINAL:
                out["note"] = "the cancel is recorded; the task is still stopping"
            return out


def build_server(upstream: Upstream) -> MCPServer:
    """The MCP server with Sandhive's tools and, for each, a description a model reads."""
    tools = Tools(upstream)
    registry: list[tuple[Callable[..., Awaitable[Any]], str, ToolAnnotations | None]] = [
        (tools.run_task, RUN_TASK, None),
        (tools.submit_task, SUBMIT_TASK, None),
        (tools.get_task, GET_TASK, _READ_ONLY),
        (tools.get_trajectory, GET_TRAJECTORY, _READ_ONLY),
        (tools.list_artifacts, LIST_ARTIFACTS, _READ_ONLY),
        (tools.read_artifact, READ_ARTIFACT, _READ_ONLY),
        (tools.cancel_task, CANCEL_TASK, ToolAnnotations(destructive_hint=True)),
    ]
    return MCPServer(
        "sandhive",
        version=__version__,  # serverInfo.version
        instructions=(
            "Sandhive runs an LLM agent inside a disposable Docker sandbox. Use run_task "
            "to get work done that needs code execution; its answer and files come back."
        ),
        tools=[
            strict(Tool.from_function(fn, description=description, annotations=hints))
            for fn, description, hints in registry
        ],
    )


def strict(tool: Tool) -> Tool:
    """`tool`, refusing arguments it does not take: the SDK drops them silently, and a
    misspelled `max_steps` would run a task with the defaults. The error names the
    argument; the schema says so too (`additionalProperties: false`)."""
    loose = tool.fn_metadata.arg_model
    known = sorted(field.alias or name for name, field in loose.model_fields.items())

    class Checked(loose):  # type: ignore[valid-type, misc]  # the SDK's model, made at run time
        @model_validator(mode="before")
        @classmethod
        def refuse_unknown(cls, data: Any) -> Any:
            unknown = sorted(set(data) - set(known)) if isinstance(data, dict) else []
            if unknown:
                raise ValueError(
                    f"unknown argument{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                    f"{tool.name} takes {', '.join(known)}"
                )
            return data

    tool.fn_metadata.arg_model = Checked
    tool.parameters = {**tool.parameters, "additionalProperties": False}
    return tool


async def _wait(sandhive: Api, task: dict[str, Any], wait_s: int, ctx: Context) -> dict[str, Any]:
    """Poll to the end, telling the client how long it has waited (clients that asked for
    progress keep a long call alive on it instead of timing out)."""
    started = time.monotonic()
    while task["status"] not in TERMINAL and time.monotonic() - started < wait_s:
        await asyncio.sleep(POLL_S)
        task = await sandhive.json("GET", _task_path(task["id"]))
        steps = (task.get("usage") or {}).get("steps")
        waited = time.monotonic() - started
        await ctx.report_progress(waited, wait_s, f"{task['status']}, {steps} steps")
    return task


def _artifact(item: dict[str, Any]) -> dict[str, Any]:
    return {k: item.get(k) for k in ("path", "size", "content_type")}


def _fit_steps(steps: list[dict[str, Any]], max_chars: int) -> str:
    """The newest steps that fit: the end of a run is where an answer or a failure is."""
    keep = ("index", "attempt", "thought", "action", "observation", "exit_code", "interrupted")
    rendered = [json.dumps({k: s.get(k) for k in keep}, ensure_ascii=False) for s in steps]
    out: list[str] = []
    used = 0
    for line in reversed(rendered):
        if used + len(line) > max_chars:
            break
        out.append(line)
        used += len(line) + 1
    dropped = len(rendered) - len(out)
    head = [f"({dropped} earlier steps left out to fit max_chars)"] if dropped else []
    return "\n".join([f"{len(steps)} steps", *head, *reversed(out)])


CHALLENGE = (
    'Bearer realm="sandhive", error="invalid_token", '
    'error_description="send a Sandhive API key as the bearer token"'
)
"""The 401's `WWW-Authenticate`: no `resource_metadata`, since this server takes Sandhive API
keys, not OAuth tokens (the MCP authorization spec's discovery starts from that parameter)."""


def require_bearer(app: Any) -> Any:
    """ASGI wrapper: an HTTP request without a bearer token gets a plain 401, not a session;
    OAuth discovery (`/.well-known/...`) a 404, so a client such as the MCP Inspector asks
    for a token instead of starting an OAuth flow that no server here would finish."""

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if str(scope.get("path", "")).startswith("/.well-known/"):
                message = "no OAuth here: send a Sandhive API key as `Authorization: Bearer`"
                await _plain(send, 404, "not_found", message, [])
                return
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            if _bearer(headers) is None:
                message = "send `Authorization: Bearer <Sandhive API key>`"
                challenge = [(b"www-authenticate", CHALLENGE.encode())]
                await _plain(send, 401, "unauthorized", message, challenge)
                return
        await app(scope, receive, send)

    return guarded


async def _plain(
    send: Any, status: int, code: str, message: str, headers: list[tuple[bytes, bytes]]
) -> None:
    """An answer in the API's error shape."""
    body = json.dumps({"error": {"code": code, "message": message, "details": None}}).encode()
    start = [(b"content-type", b"application/json"), *headers]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})


def serve(upstream: Upstream, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Run until stopped: stdio for a client that spawns us, or HTTP at http://HOST:PORT/mcp."""
    mcp = build_server(upstream)
    if upstream.transport == "stdio":
        mcp.run("stdio")
        return
    import uvicorn

    app = require_bearer(mcp.streamable_http_app(host=host))
    uvicorn.run(app, host=host, port=port, log_level="warning")
