"""Docker sandboxes over aiodocker: create, exec, copy in, copy out, remove.

The only place (with `app.sandbox.image`) that talks to the Docker API. Every
aiodocker/aiohttp failure leaves this module as `app.errors.SandboxError`.
Imported by the worker and `sandhive run`; `DockerSandbox` is an
`app.agent.types.Sandbox`.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import replace
from types import TracebackType

import aiodocker
import aiohttp
from aiodocker.containers import DockerContainer
from aiodocker.exceptions import DockerError
from aiodocker.execs import Exec
from aiodocker.stream import Stream

from app.agent.types import ExecResult, OutputCallback
from app.errors import SandboxError
from app.sandbox import network
from app.sandbox.capture import OutputCapture
from app.sandbox.channel import ChannelClosed, ExecChannel
from app.sandbox.channel_collect import collect_through_channel
from app.sandbox.egress_proxy import ProxyGate, TaskNetwork
from app.sandbox.files import CollectCaps, Collected, build_tar, collect_tar
from app.sandbox.policy import MANAGED_LABEL, EgressPolicy, SandboxConfig, container_config

EXEC_MARK = "SANDHIVE_EXEC_ID"
"""Set in every exec's environment so a timed-out command's whole process tree can be found."""
STDIN_CHUNK = 2**20
STDIN_GRACE_S = 1.0
PING_TIMEOUT_S = 10.0
SETUP_TIMEOUT_S = 60.0
KILL_TIMEOUT_S = 15.0
DEFAULT_RUNTIME = "runc"
MAX_REMOVALS = 8
"""Force-removals one host sends at once. Docker 20.10 (Debian 12's) wedged for good under
~100 at once here (a worker's stop removing its warm pool while callers deleted as many):
every kill waited on an exit event stuck behind the daemon's network lock."""
ARCHIVE_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=300)

# `docker exec` reports the host PID, useless inside the container's PID namespace:
# instead kill (twice, to catch late forks) every process whose environment carries
# the exec's mark. A process that scrubs its own environment escapes this backstop,
# but not the container's removal at the end of the task.
KILL_SCRIPT = """
for round in 1 2; do
  for f in $(grep -lzx "SANDHIVE_EXEC_ID=$1" /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}; kill -9 "${p%/environ}" 2>/dev/null
  done
done
exit 0
"""
# `linger_s` without the channel: argv's stdout/stderr go through two `cat` relays, so
# once argv exits the relays can be stopped (after the grace in $1) even if a background
# child still holds the pipes; otherwise the exec would only end when that child does.
LINGER_WRAPPER = """
exec 3> >(exec cat)
relay_out=$!
exec 4> >(exec cat >&2 3>&-)
relay_err=$!
SHLVL=$((SHLVL - 1)) "${@:2}" >&3 2>&4 3>&- 4>&-
rc=$?
exec 3>&- 4>&-
{ sleep "$1"; kill "$relay_out" "$relay_err"; } >/dev/null 2>&1 </dev/null &
wait "$relay_out" "$relay_err"
kill "$!" 2>/dev/null
exit "$rc"
"""
# Like the reference runtime's setup_env: input/ and output/ exist, the workdir is a git repo.
MAX_CHANNEL_OPENS = 4
"""Exec-channel starts per sandbox: the first, and three after the agent was lost."""
UNTAR_SCRIPT = 'mkdir -p -- "$1" && exec tar -x --no-same-owner -f - -C "$1"'
"""Unpacks the tar on stdin (built by `build_tar`, so names are already checked) under $1."""
SETUP_SCRIPT = 'mkdir -p "$1/input" "$1/output" && cd "$1" && { git init -q 2>/dev/null || true; }'


@contextmanager
def docker_errors(action: str) -> Iterator[None]:
    """Translate aiodocker/aiohttp failures into SandboxError at this boundary."""
    try:
        yield
    except DockerError as exc:
        raise SandboxError(f"{action}: {exc.message}", {"status": exc.status}) from exc
    except (aiohttp.ClientError, OSError) as exc:  # OSError covers TimeoutError
        raise SandboxError(f"{action}: {exc!r}") from exc


class DockerHost:
    """One connection to a Docker daemon (DOCKER_HOST or the local socket)."""

    def __init__(
        self, url: str | None = None, *, exec_channel: bool = True, runtime: str | None = None
    ) -> None:
        self._url = url
        self.exec_channel = exec_channel
        """Run commands through one long-lived in-sandbox agent (`app.sandbox.channel`)."""
        self.runtime = runtime
        """The OCI runtime sandboxes are made with; `ping` checks the daemon has it."""
        self._docker: aiodocker.Docker | None = None
        self._removals: asyncio.Semaphore | None = None
        self._egress_ready: set[EgressPolicy] = set()
        self._egress_lock = asyncio.Lock()
        self.egress_gate = ProxyGate(self.api)
        """Egress by name (`app.sandbox.egress_proxy`); set its `on_blocked` to hear refusals."""

    def api(self) -> aiodocker.Docker:
        """The aiodocker client, made on first use (it needs a running loop); app.sandbox only."""
        if self._docker is None:
            try:
                self._docker = aiodocker.Docker(url=self._url)
            except (ValueError, DockerError) as exc:
                raise SandboxError(f"cannot find a Docker daemon: {exc}") from exc
            # aiohttp's connector allows 100 connections; every sandbox's exec channel holds
            # one for its life, so a worker with ~100 sandboxes (episodes, tasks) waited
            # for ever on its next Docker call. No cap: the sandbox counts are the cap.
            self._docker.connector._limit = 0
        return self._docker

    async def ping(self) -> None:
        """Readiness: SandboxError unless the daemon answers within a few seconds (and, for a
        runtime other than Docker's default, knows it: otherwise every create would fail)."""
        with docker_errors("Docker daemon did not answer"):
            async with asyncio.timeout(PING_TIMEOUT_S):
                if self.runtime in (None, DEFAULT_RUNTIME):
                    await self.api().version()
                    return
                info = await self.api().system.info()
        if self.runtime not in (info.get("Runtimes") or {}):
            raise SandboxError(
                f"the Docker daemon has no OCI runtime {self.runtime!r} (SANDHIVE_SANDBOX_RUNTIME);"
                " register it in /etc/docker/daemon.json (deploy/setup-host.sh does)",
                {"runtimes": sorted(info.get("Runtimes") or {})},
            )

    async def has_image(self, name: str) -> bool:
        with docker_errors(f"inspect image {name}"):
            try:
                await self.api().images.inspect(name)
            except DockerError as exc:
                if exc.status == 404:
                    return False
                raise
        return True

    async def remove_image(self, name: str) -> None:
        """Remove an image tag (force); a missing one is fine."""
        with docker_errors(f"remove image {name}"):
            try:
                await self.api().images.delete(name, force=True)
            except DockerError as exc:
                if exc.status != 404:
                    raise

    async def create_sandbox(self, config: SandboxConfig) -> DockerSandbox:
        """Create, start and set up a container; on any failure remove what was made."""
        task_net = None
        if config.egress is not None and config.network == "egress":
            if config.egress.proxy is None:
                await self.ensure_egress(config.egress)
            else:  # by name: a network of its own whose only way out is the proxy
                task_net = await self.egress_gate.open(
                    config.egress.proxy, config.allow_domains, dict(config.labels)
                )
                egress = replace(config.egress, network=task_net.name)
                config = replace(config, egress=egress, env={**task_net.env(), **config.env})
        sandbox: DockerSandbox | None = None
        try:
            body = container_config(config)
            if task_net is not None:  # Docker's resolver may forward only to its own loopback
                body["HostConfig"]["Dns"] = ["127.0.0.1"]
            with docker_errors(f"create sandbox from {config.image}"):
                container = await self.api().containers.create(
                    body, name=f"sandhive-{secrets.token_hex(6)}"
                )
            sandbox = DockerSandbox(self, container, config, task_net)
            with docker_errors("start sandbox"):
                await container.start()
            await sandbox.setup()
        except BaseException:
            if sandbox is not None:
                with suppress(SandboxError):
                    await sandbox.remove()
            elif task_net is not None and config.egress is not None and config.egress.proxy:
                await self.egress_gate.close(config.egress.proxy, task_net)
            raise
        return sandbox

    async def ensure_egress(self, policy: EgressPolicy) -> None:
        """The egress network and its firewall, set up once per process and checked every time.

        Fails closed: an egress sandbox is never started without its firewall in place.
        """
        async with self._egress_lock:
            if policy in self._egress_ready:
                if not policy.manage_firewall or await network.firewall_installed(policy):
                    return
                self._egress_ready.discard(policy)  # someone flushed the rules: rebuild them
            with docker_errors(f"egress network {policy.network}"):
                await network.ensure_network(self.api(), policy)
            if policy.manage_firewall:
                await network.install_firewall(policy)
            elif not await network.firewall_installed(policy):
                raise SandboxError("egress firewall rules are missing on the Docker host")
            self._egress_ready.add(policy)

    async def list_sandboxes(
        self, labels: Mapping[str, str], *, with_label: str | None = None
    ) -> list[str]:
        """Ids of Sandhive containers carrying all these labels (and `with_label`, whatever
        its value), stopped ones included."""
        wanted = {MANAGED_LABEL: "1", **labels}
        selectors = [f"{key}={value}" for key, value in wanted.items()]
        if with_label is not None:
            selectors.append(with_label)
        filters = json.dumps({"label": selectors})
        with docker_errors("list sandboxes"):
            containers = await self.api().containers.list(all=True, filters=filters)
        return [container.id for container in containers]

    async def remove_container(self, container_id: str) -> None:
        """Force-remove, at most `MAX_REMOVALS` at once; a container already gone (or going)
        is fine."""
        if self._removals is None:
            self._removals = asyncio.Semaphore(MAX_REMOVALS)
        with docker_errors(f"remove container {container_id}"):
            try:
                async with self._removals:
                    await self.api().containers.container(container_id).delete(force=True, v=True)
            except DockerError as exc:
                if exc.status != 404 and not (exc.status == 409 and "in progress" in exc.message):
                    raise

    async def close(self) -> None:
        await self.egress_gate.aclose()
        if self._docker is not None:
            await self._docker.close()
            self._docker = None
            self._removals = None

    async def __aenter__(self) -> DockerHost:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class DockerSandbox:
    """One running container; implements `app.agent.types.Sandbox`."""

    def __init__(
        self,
        host: DockerHost,
        container: DockerContainer,
        config: SandboxConfig,
        task_net: TaskNetwork | None = None,
    ) -> None:
        self.id: str = container.id
        self.config = config
        self._task_net = task_net
        self._host = host
        self._container = container
        self._channel: ExecChannel | None = None
        self._channel_opens = 0 if host.exec_channel else MAX_CHANNEL_OPENS
        self._opening = asyncio.Lock()

    @property
    def uses_channel(self) -> bool:
        """True while commands go through the exec channel rather than `docker exec`."""
        return self._channel is not None and self._channel.alive

    async def _live_channel(self) -> ExecChannel | None:
        """The exec channel, (re)started when it is not running; None: use `docker exec`.

        A sandboxed command can kill the agent (`pkill python3`) or make it drop the
        channel (a forged frame): the next command starts a new one, a few times per
        sandbox, then the sandbox stays on `docker exec`. An image where the agent
        cannot start at all (no python3) is not asked again.
        """
        if self._channel is not None and self._channel.alive:
            return self._channel
        async with self._opening:  # concurrent commands start one agent, not several
            if self._channel is not None and self._channel.alive:
                return self._channel
            if self._channel_opens >= MAX_CHANNEL_OPENS:
                return None
            self._channel_opens += 1
            if self._channel is not None:
                await self._channel.close()
            cap = self.config.output_cap_bytes
            self._channel = await ExecChannel.open(self._container, cap)
            if self._channel is None:
                self._channel_opens = MAX_CHANNEL_OPENS
            return self._channel

    async def setup(self) -> None:
        """mkdir input/ output/ and git init in the workdir, as the reference runtime does."""
        done = await self.exec(
            ["sh", "-c", SETUP_SCRIPT, "sh", self.config.workdir],
            workdir="/",
            timeout_s=SETUP_TIMEOUT_S,
        )
        if done.exit_code != 0:
            detail = done.stderr.decode(errors="replace")[-2000:]
            raise SandboxError(f"sandbox setup failed ({done.exit_code}): {detail}")

    async def exec(
        self,
        argv: Sequence[str],
        *,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        on_output: OutputCallback | None = None,
        linger_s: float | None = None,
        user: str | None = None,
        direct: bool = False,
    ) -> ExecResult:
        """Run argv to completion (or timeout_s), stdout and stderr kept apart; as `user`
        of the image (name or uid) when given, else as the container's user (root).
        `direct`: by `docker exec`, never through the exec channel (whose process the
        sandbox's own commands can reach)."""
        if not argv:
            raise ValueError("argv must not be empty")
        channel = None if direct else await self._live_channel()
        if channel is not None:
            with suppress(ChannelClosed):  # closed just now: nothing ran, use `docker exec`
                return await channel.exec(
                    argv,
                    workdir=workdir or self.config.workdir,
                    env=env,
                    stdin=stdin,
                    timeout_s=timeout_s,
                    on_output=on_output,
                    linger_s=linger_s,
                    user=user,
                )
        if linger_s is not None:
            argv = ["bash", "-c", LINGER_WRAPPER, "bash", str(linger_s), *argv]
        token = secrets.token_hex(12)
        with docker_errors("exec in sandbox"):
            run = await self._container.exec(
                list(argv),
                stdin=stdin is not None,
                environment={**(env or {}), EXEC_MARK: token},
                workdir=workdir or self.config.workdir,
                user=user or "",
            )
        out = OutputCapture(self.config.output_cap_bytes)
        err = OutputCapture(self.config.output_cap_bytes)
        try:
            async with asyncio.timeout(timeout_s):
                await _pump(run, stdin, out, err, on_output)
                code = await _exit_code(run)
        except TimeoutError:
            await self._kill(token)
            return ExecResult(-1, out.value(), err.value(), timed_out=True)
        except asyncio.CancelledError:
            # The task's wall clock or a cancel: the command must not outlive the call.
            await self._kill(token)
            raise
        return ExecResult(code, out.value(), err.value())

    async def shell(
        self,
        session: str,
        command: str,
        *,
        workdir: str,
        timeout_s: float | None = None,
        on_output: OutputCallback | None = None,
        linger_s: float | None = None,
    ) -> ExecResult | None:
        """Run command in the channel agent's persistent bash; None without a channel."""
        channel = await self._live_channel()
        if channel is None:
            return None
        with suppress(ChannelClosed):
            return await channel.shell(
                session,
                command,
                workdir=workdir,
                timeout_s=timeout_s,
                on_output=on_output,
                linger_s=linger_s,
            )
        return None

    async def _kill(self, token: str) -> None:
        """Best effort: SIGKILL the timed-out command and everything it started."""
        with suppress(SandboxError, TimeoutError):
            async with asyncio.timeout(KILL_TIMEOUT_S):
                await self.exec(["sh", "-c", KILL_SCRIPT, "sh", token], workdir="/")

    async def put_files(self, dest_dir: str, files: Sequence[tuple[str, bytes]]) -> None:
        """Copy files under dest_dir; bad names raise ValueError before anything is sent."""
        if not dest_dir.startswith("/"):
            raise ValueError(f"dest_dir must be absolute, got {dest_dir!r}")
        archive = build_tar(files)
        if self.uses_channel:
            # Through the channel (~5 ms) rather than Docker's archive API (~70-90 ms):
            # this is most of a warm-pool claim's start time.
            made = await self.exec(
                ["sh", "-c", UNTAR_SCRIPT, "sh", dest_dir], workdir="/", stdin=archive, timeout_s=60
            )
            if made.exit_code not in (126, 127):  # no sh/tar in the image: archive API below
                if made.exit_code != 0:
                    detail = made.stderr.decode(errors="replace")[-2000:]
                    raise SandboxError(f"cannot copy files to {dest_dir} in sandbox: {detail}")
                return
        made = await self.exec(["mkdir", "-p", "--", dest_dir], workdir="/", timeout_s=60)
        if made.exit_code != 0:
            detail = made.stderr.decode(errors="replace")[-2000:]
            raise SandboxError(f"cannot create {dest_dir} in sandbox: {detail}")
        with docker_errors("copy files into sandbox"):
            await self._container.put_archive(dest_dir, archive)  # type: ignore[no-untyped-call]

    async def collect(self, src_dir: str, caps: CollectCaps) -> Collected:
        """Regular files below src_dir (or src_dir itself), within caps; missing src_dir: empty."""
        path = posixpath.normpath(src_dir)
        if not path.startswith("/") or path == "/":
            raise ValueError(f"src_dir must be an absolute path below /, got {src_dir!r}")
        if self.uses_channel:  # no archive API round trip (dockerd re-executes itself for it)
            through_channel = await collect_through_channel(self.exec, path, caps)
            if through_channel is not None:
                return through_channel
        with docker_errors(f"collect {path}"):
            try:
                # aiodocker's get_archive buffers the whole tar; stream it ourselves instead.
                # Uncompressed: aiohttp would gunzip on the event loop (seconds for GiBs).
                async with self._host.api()._query(
                    f"containers/{self.id}/archive",
                    method="GET",
                    params={"path": path},
                    headers={"Accept-Encoding": "identity"},
                    timeout=ARCHIVE_TIMEOUT,
                ) as response:
                    try:
                        return await collect_tar(response.content, path, caps)
                    finally:
                        response.close()
            except DockerError as exc:
                if exc.status == 404 and "no such container" not in exc.message.lower():
                    return Collected()
                raise

    async def remove(self) -> None:
        """Force-remove the container; idempotent."""
        self._channel_opens = MAX_CHANNEL_OPENS  # nothing may start an agent any more
        if self._channel is not None:
            await self._channel.close()
        await self._host.remove_container(self.id)
        net, self._task_net = self._task_net, None
        if net is not None and self.config.egress is not None and self.config.egress.proxy:
            await self._host.egress_gate.close(self.config.egress.proxy, net)


async def _pump(
    run: Exec,
    stdin: bytes | None,
    out: OutputCapture,
    err: OutputCapture,
    on_output: OutputCallback | None,
) -> None:
    """Stream the exec: feed stdin (then EOF) while reading stdout/stderr as they come."""
    with docker_errors("exec in sandbox"):
        async with run.start(detach=False) as stream:
            reader = asyncio.create_task(_read_output(stream, out, err, on_output))
            writer = None if stdin is None else asyncio.create_task(_feed_stdin(stream, stdin))
            try:
                if writer is None:
                    await reader
                else:
                    await _read_until_exit(run, reader)
            finally:
                tasks = [task for task in (reader, writer) if task is not None]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                if writer is not None:
                    _abort(stream)  # unsent stdin would keep the socket open forever


async def _read_output(
    stream: Stream, out: OutputCapture, err: OutputCapture, on_output: OutputCallback | None
) -> None:
    while (message := await stream.read_out()) is not None:
        name, capture = ("stderr", err) if message.stream == 2 else ("stdout", out)
        capture.add(message.data)
        if on_output is not None:
            await on_output(name, message.data)


async def _read_until_exit(run: Exec, reader: asyncio.Task[None]) -> None:
    """Wait for the output to end, or for the command to exit without reading all its stdin.

    In the second case Docker keeps the stream open (its stdin copy is stuck), so after
    a grace period for output still in flight we stop reading ourselves.
    """
    delay = 0.05
    while True:
        done, _ = await asyncio.wait({reader}, timeout=delay)
        if done:
            return reader.result()
        if not (await run.inspect()).get("Running"):
            done, _ = await asyncio.wait({reader}, timeout=STDIN_GRACE_S)
            return reader.result() if done else None
        delay = min(delay * 2, 1.0)


async def _feed_stdin(stream: Stream, data: bytes) -> None:
    try:
        for start in range(0, len(data), STDIN_CHUNK):
            await stream.write_in(data[start : start + STDIN_CHUNK])
        _transport(stream).write_eof()  # EOF on stdin; the output keeps flowing back
    except (OSError, RuntimeError, aiohttp.ClientError):
        pass  # the command exited without reading all of its input


def _transport(stream: Stream) -> asyncio.WriteTransport:
    """The hijacked socket under an exec stream, which aiodocker does not expose."""
    # aiodocker has no public half-close (Stream.close() also drops the read side).
    response = stream._resp
    connection = response.connection if response is not None else None
    transport = connection.transport if connection is not None else None
    if not isinstance(transport, asyncio.WriteTransport):
        raise RuntimeError("exec stream has no transport")
    return transport


def _abort(stream: Stream) -> None:
    with suppress(RuntimeError):
        _transport(stream).abort()


async def _exit_code(run: Exec) -> int:
    """The exit code, once Docker has recorded it (the stream may end a moment earlier)."""
    delay = 0.005
    while True:
        with docker_errors("inspect exec"):
            info = await run.inspect()
        if not info.get("Running") and info.get("ExitCode") is not None:
            return int(info["ExitCode"])
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.25)
