"""What the E2B SDK speaks to a sandbox (`E2B_SANDBOX_URL` = this server's `/e2b/envd`): envd's
Connect RPC services and its `/files` route, for the sandbox its `E2b-Sandbox-Id` header
names, as the tenant its `X-Access-Token` (a Sandhive key) belongs to.

The Connect protocol is served by `connectrpc` with the message types and service stubs
that ship in the `e2b` package (its `envd` modules): the server and the SDK share one
definition. `Process.Start` is a sandbox command streamed (`services.sandboxes.processes`),
its output as data events and its exit as the end event; `SendSignal` reaches the command's
whole tree by its pid; `List` finds what still runs. The filesystem's calls run one small
program in the sandbox each; `/files` reads and writes through the sandbox's file API. What
envd has and Sandhive has not (a PTY, stdin sent later, reattaching to a process,
watching a directory) answers Connect's `unimplemented`.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import math
import posixpath
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.filesystem import filesystem_pb as fs_pb
from e2b.envd.filesystem.filesystem_connect import FilesystemASGIApplication
from e2b.envd.process import process_pb as pb
from e2b.envd.process.process_connect import ProcessASGIApplication
from protobuf import Oneof
from protobuf.wkt import Timestamp
from pydantic import ValidationError
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from app.api.e2b.auth import e2b_tenant, error, key_id
from app.api.streamcap import take_slot
from app.errors import AppError, Conflict, InvalidInput, NotFound, TooLarge
from app.kit import outage
from app.resources import Resources
from app.schemas.sandboxes import ExecRequest
from app.services.sandboxes import files as sandbox_files
from app.services.sandboxes import processes

SANDBOX_HEADER = "e2b-sandbox-id"
CALL: contextvars.ContextVar[HTTPConnection] = contextvars.ContextVar("e2b_call")
"""The request an RPC serves (connectrpc hands services only the headers)."""
SANDBOX_ID = re.compile(r"^sbx_[0-9A-Za-z]{1,64}$")
USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$")
CODES = {
    400: Code.INVALID_ARGUMENT,
    401: Code.UNAUTHENTICATED,
    403: Code.PERMISSION_DENIED,
    404: Code.NOT_FOUND,
    409: Code.NOT_FOUND,  # the sandbox ended: gone, for E2B
    413: Code.RESOURCE_EXHAUSTED,
    422: Code.INVALID_ARGUMENT,
    429: Code.RESOURCE_EXHAUSTED,
    502: Code.UNAVAILABLE,  # the sandbox was not found (`Gone`)
    503: Code.UNAVAILABLE,
    504: Code.DEADLINE_EXCEEDED,
}
SIGNALS = {pb.Signal.SIGKILL: "KILL", pb.Signal.SIGTERM: "TERM"}
ERROR_CODES = {"gateway_timeout": Code.DEADLINE_EXCEEDED, "not_found": Code.UNAVAILABLE}
"""A streamed command's `error` event by its code (its worker lost: `unavailable`)."""


@dataclass(frozen=True)
class Target:
    """Who asks, for which of its sandboxes, as which of the sandbox's users."""

    res: Resources
    caller: processes.Caller
    user: str | None


async def target(conn: HTTPConnection) -> Target:
    """The caller and its running sandbox; AppError (401, 429, 400) otherwise, and
    `Gone` when the sandbox is not one of its running ones."""
    res: Resources = conn.state.res
    tenant = await e2b_tenant(conn, res)
    sandbox_id = conn.headers.get(SANDBOX_HEADER, "").strip()
    if not SANDBOX_ID.fullmatch(sandbox_id):
        raise InvalidInput(f"the {SANDBOX_HEADER} header must name a sandbox (sbx_...)")
    caller = processes.Caller(
        res.sessions, res.redis, res.settings, tenant, key_id(conn, res), sandbox_id
    )
    try:
        await caller.held()
    except (NotFound, Conflict) as exc:
        raise Gone(f"sandbox {sandbox_id} was not found") from exc
    return Target(res, caller, _user(conn))


class Gone(AppError):
    """The sandbox is not the caller's running one: envd's proxy answers a 502 saying it
    "was not found", which the SDK takes for a sandbox killed or past its timeout."""

    status, code = 502, "sandbox_not_found"


def _user(conn: HTTPConnection) -> str | None:
    """envd's user, `Authorization: Basic base64(user:)`; none: the sandbox's (root)."""
    scheme, _, value = conn.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        name = base64.b64decode(value).decode().partition(":")[0]
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput("the Authorization header's user is not base64 text") from None
    if name and not USER.fullmatch(name):
        raise InvalidInput(f"not a user name: {name[:64]!r}")
    return name or None


def _raise(exc: AppError) -> NoReturn:
    code = Code.ALREADY_EXISTS if isinstance(exc, processes.Exists) else CODES.get(exc.status)
    raise ConnectError(code or Code.INTERNAL, exc.message) from exc


@contextlib.asynccontextmanager
async def _rpc() -> AsyncIterator[Target]:
    """The call's target, Sandhive's errors as Connect's: a request's bad path or user is
    `invalid_argument`, Postgres or Redis out of reach `unavailable`."""
    try:
        yield await target(CALL.get())
    except AppError as exc:
        _raise(exc)
    except ValidationError as exc:
        raise ConnectError(Code.INVALID_ARGUMENT, _first(exc)) from exc
    except Exception as exc:
        down = outage.unavailable(exc, 1)
        if down is None:
            raise
        raise ConnectError(Code.UNAVAILABLE, down.message) from exc


def _first(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}"


def _unsupported(what: str) -> NoReturn:
    raise ConnectError(Code.UNIMPLEMENTED, f"{what} is not supported by this server")


class ProcessService:
    """envd's `process.Process` on a sandbox's commands."""

    async def start(
        self, request: pb.StartRequest, ctx: RequestContext[pb.StartRequest, pb.StartResponse]
    ) -> AsyncIterator[pb.StartResponse]:
        if request.has_field("pty"):
            _unsupported("a PTY")
        config = request.process or pb.ProcessConfig()
        timeout_ms = ctx.timeout_ms
        async with _rpc() as call:
            body = _exec(config, call.user, timeout_ms)
            slot = await take_slot(call.res, call.caller.tenant)
            async with slot.held():
                pid, events = await processes.start(call.caller, body, stdin=request.stdin)
                async with contextlib.aclosing(events):
                    yield _event("start", pb.ProcessEvent.StartEvent(pid=pid))
                    async for name, data in events:
                        yield _process_event(name, data)

    async def send_signal(
        self,
        request: pb.SendSignalRequest,
        ctx: RequestContext[pb.SendSignalRequest, pb.SendSignalResponse],
    ) -> pb.SendSignalResponse:
        pid = _pid(request.process)
        name = SIGNALS.get(request.signal)
        if name is None:
            raise ConnectError(Code.INVALID_ARGUMENT, f"unsupported signal {request.signal}")
        async with _rpc() as call:
            await processes.signal(call.caller, pid, name)
        return pb.SendSignalResponse()

    async def list(
        self, request: pb.ListRequest, ctx: RequestContext[pb.ListRequest, pb.ListResponse]
    ) -> pb.ListResponse:
        async with _rpc() as call:
            found = await processes.listing(call.caller)
        return pb.ListResponse(
            processes=[
                pb.ProcessInfo(
                    config=pb.ProcessConfig(cmd=argv[0] if argv else "", args=argv[1:], cwd=cwd),
                    pid=pid,
                )
                for pid, argv, cwd in found
            ]
        )

    def connect(self, request: Any, ctx: Any) -> AsyncIterator[pb.ConnectResponse]:
        _unsupported("reattaching to a running process")

    async def update(self, request: Any, ctx: Any) -> pb.UpdateResponse:
        _unsupported("resizing a PTY")

    async def stream_input(self, request: Any, ctx: Any) -> pb.StreamInputResponse:
        _unsupported("streaming stdin (send it with send_stdin)")

    async def send_input(
        self,
        request: pb.SendInputRequest,
        ctx: RequestContext[pb.SendInputRequest, pb.SendInputResponse],
    ) -> pb.SendInputResponse:
        pid = _pid(request.process)
        given = request.input.input if request.input is not None else None
        if given is None or given.field != "stdin":
            _unsupported("input other than stdin (a PTY)")
        async with _rpc() as call:
            await processes.send_input(call.caller, pid, bytes(given.value))
        return pb.SendInputResponse()

    async def close_stdin(
        self,
        request: pb.CloseStdinRequest,
        ctx: RequestContext[pb.CloseStdinRequest, pb.CloseStdinResponse],
    ) -> pb.CloseStdinResponse:
        async with _rpc() as call:
            await processes.close_stdin(call.caller, _pid(request.process))
        return pb.CloseStdinResponse()


def _exec(config: pb.ProcessConfig, user: str | None, timeout_ms: float | None) -> ExecRequest:
    """The sandbox command of envd's process config; its timeout the call's deadline."""
    timeout_s = math.ceil(timeout_ms / 1000) if timeout_ms and timeout_ms > 0 else None
    try:
        return ExecRequest(
            argv=[config.cmd, *config.args],
            cwd=config.cwd or None,
            env=dict(config.envs),
            user=user,
            timeout_s=timeout_s,
            output_encoding="base64",
        )
    except ValueError as exc:
        raise ConnectError(Code.INVALID_ARGUMENT, f"invalid process: {exc}") from exc


def _process_event(name: str, data: Mapping[str, Any] | None) -> pb.StartResponse:
    if data is None:
        return _event("keepalive", pb.ProcessEvent.KeepAlive())
    if name == "output":
        chunk = base64.b64decode(data["data"])
        return _event("data", pb.ProcessEvent.DataEvent(output=Oneof(data["stream"], chunk)))
    if name == "exit":
        code = data["exit_code"]
        if data["timed_out"] or code is None:
            end = pb.ProcessEvent.EndEvent(
                exit_code=-1, exited=False, status="signal: killed", error="the command timed out"
            )
        else:
            end = pb.ProcessEvent.EndEvent(
                exit_code=code, exited=True, status=f"exit status {code}"
            )
        return _event("end", end)
    code = ERROR_CODES.get(str(data.get("code")), Code.UNAVAILABLE)
    raise ConnectError(code, str(data.get("message", "the command broke off")))


def _event(kind: str, value: Any) -> pb.StartResponse:
    event: Any = Oneof(kind, value)  # the oneof's member named by `kind`
    return pb.StartResponse(event=pb.ProcessEvent(event=event))


def _pid(selector: pb.ProcessSelector | None) -> int:
    chosen = selector.selector if selector is not None else None
    if chosen is None or chosen.field != "pid":
        raise ConnectError(Code.INVALID_ARGUMENT, "processes are chosen by pid here")
    return int(chosen.value)


class FilesystemService:
    """envd's `filesystem.Filesystem` on a sandbox's files."""

    async def stat(
        self, request: fs_pb.StatRequest, ctx: RequestContext[Any, Any]
    ) -> fs_pb.StatResponse:
        found = await _fs("stat", request.path)
        return fs_pb.StatResponse(entry=_entry(found))

    async def make_dir(
        self, request: fs_pb.MakeDirRequest, ctx: RequestContext[Any, Any]
    ) -> fs_pb.MakeDirResponse:
        found = await _fs("mkdir", request.path)
        return fs_pb.MakeDirResponse(entry=_entry(found))

    async def move(
        self, request: fs_pb.MoveRequest, ctx: RequestContext[Any, Any]
    ) -> fs_pb.MoveResponse:
        found = await _fs("move", request.source, request.destination)
        return fs_pb.MoveResponse(entry=_entry(found))

    async def list_dir(
        self, request: fs_pb.ListDirRequest, ctx: RequestContext[Any, Any]
    ) -> fs_pb.ListDirResponse:
        found = await _fs("list", request.path, str(max(request.depth, 1)))
        return fs_pb.ListDirResponse(entries=[_entry(entry) for entry in found])

    async def remove(
        self, request: fs_pb.RemoveRequest, ctx: RequestContext[Any, Any]
    ) -> fs_pb.RemoveResponse:
        await _fs("remove", request.path)
        return fs_pb.RemoveResponse()

    def watch_dir(self, request: Any, ctx: Any) -> AsyncIterator[fs_pb.WatchDirResponse]:
        _unsupported("watching a directory")

    async def create_watcher(self, request: Any, ctx: Any) -> fs_pb.CreateWatcherResponse:
        _unsupported("watching a directory")

    async def get_watcher_events(self, request: Any, ctx: Any) -> fs_pb.GetWatcherEventsResponse:
        _unsupported("watching a directory")

    async def remove_watcher(self, request: Any, ctx: Any) -> fs_pb.RemoveWatcherResponse:
        _unsupported("watching a directory")


async def _fs(op: str, *args: str) -> Any:
    async with _rpc() as call:
        try:
            return await processes.fs(call.caller, op, *args, user=call.user)
        except AppError as exc:
            _raise(exc)


def _entry(found: Mapping[str, Any]) -> fs_pb.EntryInfo:
    kind = fs_pb.FileType.DIRECTORY if found["type"] == "dir" else fs_pb.FileType.FILE
    return fs_pb.EntryInfo(
        name=found["name"],
        type=kind,
        path=found["path"],
        size=int(found["size"]),
        mode=int(found["mode"]),
        permissions=found["permissions"],
        owner=found["owner"],
        group=found["group"],
        modified_time=Timestamp.from_datetime(datetime.fromtimestamp(found["mtime"], UTC)),
        symlink_target=found["symlink_target"],
        is_symlink=bool(found["is_symlink"]),
    )


async def read_file(request: Request) -> Response:
    """envd's `GET /files?path=P`: the file's bytes, or E2B's error."""
    try:
        c = (await target(request)).caller
        _as_root(request)
        path = _path(request)
        opened = await sandbox_files.read(
            c.sessions, c.redis, c.settings, c.tenant, c.sandbox_id, path
        )
    except AppError as exc:
        return error(exc.status, exc.message, exc.headers() or None)
    headers = {"Content-Length": str(opened.size), "X-Content-Type-Options": "nosniff"}
    return StreamingResponse(opened.chunks, media_type="application/octet-stream", headers=headers)


async def write_files(request: Request) -> Response:
    """envd's `POST /files` (multipart, one part per file; `path` names a lone file, else
    each part's file name): `[{name, type, path}]` of what was written."""
    try:
        c = (await target(request)).caller
        _as_root(request)
        cap = c.settings.sandbox_files_max_bytes
        written = []
        async with request.form(max_files=1000) as form:
            parts = [part for _, part in form.multi_items() if not isinstance(part, str)]
            for part in parts:
                path = _path(request) if len(parts) == 1 else (part.filename or "")
                content = await part.read()
                if len(content) > cap:
                    raise TooLarge(f"{path}: over SANDHIVE_SANDBOX_FILES_MAX_BYTES={cap}")
                done = await sandbox_files.write(
                    c.sessions, c.redis, c.settings, c.tenant, c.sandbox_id, path, content
                )
                name = posixpath.basename(done.path)
                written.append({"name": name, "type": "file", "path": done.path})
    except AppError as exc:
        return error(exc.status, exc.message, exc.headers() or None)
    return JSONResponse(written)


def _as_root(request: Request) -> None:
    """Files are read and written as root here: another `username` is refused, not
    ignored (a file the SDK wrote for a user would otherwise belong to root)."""
    name = request.query_params.get("username")
    if name not in (None, "", "root"):
        raise InvalidInput(f"files as user {name[:64]!r} are not supported by this server")


def _path(request: Request) -> str:
    path = request.query_params.get("path", "")
    if not path:
        raise InvalidInput("missing the path")
    return path


class Envd:
    """The ASGI app mounted at `/e2b/envd`: Connect RPCs to the two services, `/files`,
    and `/health`."""

    def __init__(self) -> None:
        self._process = ProcessASGIApplication(ProcessService())  # type: ignore[arg-type]
        self._filesystem = FilesystemASGIApplication(FilesystemService())  # type: ignore[arg-type]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        request = Request(scope, receive)
        token = CALL.set(request)
        try:
            if path.startswith("/process.Process/"):
                await self._process(scope, receive, send)
            elif path.startswith("/filesystem.Filesystem/"):
                await self._filesystem(scope, receive, send)
            else:
                response = await self._plain(path, request)
                await response(scope, receive, send)
        finally:
            CALL.reset(token)

    async def _plain(self, path: str, request: Request) -> Response:
        if path == "/health":  # the SDK's probe after a failure: is the sandbox there?
            try:
                await target(request)
            except AppError as exc:
                return error(exc.status, exc.message, exc.headers() or None)
            return Response(status_code=204)
        if path == "/files" and request.method == "GET":
            return await read_file(request)
        if path == "/files" and request.method == "POST":
            return await write_files(request)
        return error(404, f"{request.method} {path} is not an envd route of this server")
