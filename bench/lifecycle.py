"""Machine CPU of one sandbox lifecycle, per variant of the create request, by process.

    .venv/bin/python bench/lifecycle.py [--cycles 30] [--concurrency 4] [--rounds 3]
                                        [--only NAME ...] [--list]

Each variant is one change from the create body the worker really sends
(`app.sandbox.policy.container_config` with the defaults of `SandboxConfig`) or from how
the sandbox ends. A cycle is what a task costs Docker: `POST containers/create`,
`POST containers/{id}/start`, the exec channel (`app.sandbox.channel`: one exec, the
agent's start) running the sandbox's setup (`mkdir input output`, `git init`), then the
end (our `DELETE ?force=1&v=1`, or the variant's). `--cycles` cycles run `--concurrency`
at a time against the real daemon; the variants are interleaved over `--rounds` rounds and
the table shows each one's quietest round (lowest docker-side CPU: on a shared machine other
work only ever adds CPU; `--median` for the median round instead).

CPU per cycle, from /proc (utime + stime, in ms): `dockerd` and `containerd` with the
children they reaped; `shims`: the variant's own containerd-shim-runc-v2 processes (found
by container id, sampled every 20 ms, last value seen); `runc+ctr`: what those shims
reaped (every runc invocation, the container's processes: docker-init, sleep, the channel
agent, setup); `in-ctr`: the part of that spent inside the container, from its cgroup
(cpuacct.usage read just before its end, so runc ~ runc+ctr - in-ctr); `other`: the
machine's busy time (/proc/stat) less all of the above and less this process's own, so
kernel work (mounts, namespaces, cgroups) not charged to a
process, the runc calls after a shim's last sample and whatever else runs on the machine;
`total`: the machine's busy time less this process's. The load average is printed: on a
shared machine `other` carries other people's work, the named columns much less of it; on a
quiet one compare `total` (a shim's last reaps land in `runc+ctr` or in `other` depending on
whether the sampler caught them) and `in-ctr` (exact).

Measure-only variants (seccomp off, no limits, a bridge network, ...) weaken the sandbox;
they are here to see what each piece of the hardening costs, not to be shipped. Every
container carries `sandhive.local=1` and `sandhive.bench=<run id>` and is removed by the
end of its cycle (and by a sweep at exit). The squashed image (`docker export | docker
import` of the sandbox image: one layer) is built for the run and removed after it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiodocker
from aiodocker.containers import DockerContainer
from aiodocker.exceptions import DockerError
from aiodocker.stream import Stream
from yarl import URL

from app.sandbox.channel import AGENT_SOURCE, ExecChannel
from app.sandbox.docker import SETUP_SCRIPT
from app.sandbox.policy import BASE_ENV, SandboxConfig, container_config

IMAGE = os.environ.get("SANDHIVE_BENCH_IMAGE", "sandhive-sandbox:latest")
PACKAGE_IMAGE = os.environ.get("SANDHIVE_BENCH_PACKAGE_IMAGE", "llm-in-sandbox-local:v0.1")
SQUASHED = "sandhive-sandbox:bench-squashed"
CLK_TCK = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.02
RUN_ID = secrets.token_hex(4)
LABELS = {"sandhive.local": "1", "sandhive.bench": RUN_ID}
Body = dict[str, Any]


@dataclass(frozen=True)
class Variant:
    name: str
    edit: Callable[[Body], None] = lambda body: None
    end: str = "delete"
    """delete (force, v: ours) | kill-autoremove | stop-delete | run-like (wait, then delete)."""
    stop_t: int | None = None
    channel: bool = True
    """Setup through the exec channel (ours); False: one plain `docker exec` (the package's)."""
    attach: bool = False
    """The channel's agent is the container's main process, reached by attach (no exec)."""
    setup: bool = True
    """False: no command at all (not a usable sandbox: the floor of a container's life)."""
    measure_only: bool = False


def _host(body: Body) -> Body:
    host: Body = body["HostConfig"]
    return host


def _set(**values: Any) -> Callable[[Body], None]:
    return lambda body: _host(body).update(values)


def _drop(*keys: str) -> Callable[[Body], None]:
    def edit(body: Body) -> None:
        for key in keys:
            _host(body).pop(key, None)

    return edit


def _no_tmpfs(path: str | None) -> Callable[[Body], None]:
    def edit(body: Body) -> None:
        tmpfs = _host(body)["Tmpfs"]
        for key in list(tmpfs) if path is None else [path]:
            del tmpfs[key]

    return edit


def _workdir_plain_tmpfs(body: Body) -> None:
    """The workdir as a HostConfig tmpfs mount, not a tmpfs volume (no volume create/remove)."""
    host = _host(body)
    volume = host.pop("Mounts")[0]
    options = volume["VolumeOptions"]["DriverConfig"]["Options"]["o"]
    host["Tmpfs"][volume["Target"]] = f"rw,exec,{options}"


def _agent_as_main(body: Body) -> None:
    """The channel's agent as the main process (its stdin/stdout attached before the start),
    under a `timeout` keeping the deadline; a `sleep` holds the sandbox if the agent dies."""
    body.update(
        Cmd=[
            *("timeout", "-s", "KILL", body["Cmd"][-1]),
            *("sh", "-c", 'python3 -c "$1"; exec sleep infinity </dev/null >/dev/null 2>&1'),
            *("sandhive-main", AGENT_SOURCE),
        ],
        OpenStdin=True,
        StdinOnce=True,
        AttachStdin=True,
        AttachStdout=True,
        AttachStderr=True,
    )


def _both(*edits: Callable[[Body], None]) -> Callable[[Body], None]:
    def edit(body: Body) -> None:
        for one in edits:
            one(body)

    return edit


def _image(name: str) -> Callable[[Body], None]:
    return lambda body: body.update(Image=name)


def _package_body(body: Body) -> None:
    """What the package's DockerRuntime sends (REFERENCE.md 1.5): `containers.run(image,
    "sleep infinity", detach, stdin_open, tty, environment, working_dir)`, nothing else."""
    env = [f"{k}={v}" for k, v in BASE_ENV.items() if k != "LANG"]
    image = PACKAGE_IMAGE if _image_exists(PACKAGE_IMAGE) else IMAGE
    body.clear()
    body.update(
        Image=image,
        Cmd=["sleep", "infinity"],
        Tty=True,
        OpenStdin=True,
        Env=env,
        WorkingDir="/testbed",
        Labels=dict(LABELS),
        HostConfig={},
    )


VARIANTS = (
    Variant("baseline (ours)"),
    Variant("log driver json-file", _set(LogConfig={"Type": "json-file", "Config": {}})),
    *(
        Variant(f"no tmpfs {path}", _no_tmpfs(path))
        for path in ("/tmp", "/var/tmp", "/root", "/run")
    ),
    Variant("no scratch tmpfs at all", _no_tmpfs(None), measure_only=True),
    Variant("workdir: plain tmpfs, no volume", _workdir_plain_tmpfs),
    Variant("network default bridge", _set(NetworkMode="bridge"), measure_only=True),
    Variant(
        "seccomp unconfined",
        _set(SecurityOpt=["no-new-privileges", "seccomp=unconfined"]),
        measure_only=True,
    ),
    Variant("Init off", _set(Init=False)),
    Variant(
        "no memory/pids/cpu limits",
        _drop("Memory", "MemorySwap", "PidsLimit", "NanoCpus"),
        measure_only=True,
    ),
    Variant("no Ulimits", _drop("Ulimits")),
    Variant("CgroupnsMode host", _set(CgroupnsMode="host"), measure_only=True),
    Variant("AutoRemove off, DELETE", _set(AutoRemove=False)),
    Variant("kill, then AutoRemove (no DELETE)", end="kill-autoremove"),
    Variant("stop (t=10 default), DELETE", end="stop-delete"),
    Variant("stop t=1, DELETE", end="stop-delete", stop_t=1),
    Variant(
        "StopTimeout=1 in body, stop, DELETE", lambda b: b.update(StopTimeout=1), "stop-delete"
    ),
    Variant("run-like: wait(next-exit) before start", end="run-like"),
    Variant("squashed image (1 layer)", _image(SQUASHED)),
    Variant("runtime crun", _set(Runtime="crun")),
    Variant("setup by docker exec, no channel", channel=False),
    Variant("no command at all (the floor)", setup=False, measure_only=True),
    Variant("no command at all, crun", _set(Runtime="crun"), setup=False, measure_only=True),
    Variant("channel agent as main process (attach)", _agent_as_main, attach=True),
    Variant(
        "agent as main process, crun",
        _both(_agent_as_main, _set(Runtime="crun")),
        attach=True,
    ),
    Variant("package's run shape, stop t=5", _package_body, "stop-delete", 5, channel=False),
    Variant("package's run shape, DELETE", _package_body, channel=False),
)


def _image_exists(name: str) -> bool:
    probe = subprocess.run(["docker", "image", "inspect", name], capture_output=True, check=False)
    return probe.returncode == 0


def _ticks(pid: int) -> tuple[int, int]:
    """(utime + stime, cutime + cstime) of a process, in clock ticks."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def _busy_ticks() -> int:
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle, iowait = values[3], values[4]
    return sum(values[:8]) - idle - iowait


def _pid_of(name: str) -> int:
    out = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


class ShimSampler:
    """Last-seen CPU of the shims of the containers it is told about, sampled in a thread."""

    def __init__(self) -> None:
        self.wanted: set[str] = set()
        self.shims: dict[int, tuple[int, int]] = {}
        self._seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ShimSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def take(self) -> tuple[float, float]:
        """(shims' own, what they reaped) in ticks since the last take; forgets them."""
        own = sum(v[0] for v in self.shims.values())
        reaped = sum(v[1] for v in self.shims.values())
        self.shims = {}
        return own, reaped

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            for name in os.listdir("/proc"):
                if name.isdigit():
                    self._sample(int(name))

    def _sample(self, pid: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            if pid in self.shims:
                self.shims[pid] = _ticks(pid)
            elif pid not in self._seen:
                self._seen.add(pid)
                with open(f"/proc/{pid}/cmdline", "rb") as cmd:
                    args = cmd.read().split(b"\0")
                if b"containerd-shim" in args[0] and b"-id" in args:
                    cid = args[args.index(b"-id") + 1].decode()
                    if cid in self.wanted:
                        self.shims[pid] = _ticks(pid)


@dataclass
class Round:
    """One variant's batch: CPU in ms per cycle by column, wall per cycle."""

    cpu: dict[str, float] = field(default_factory=dict)
    wall_ms: float = 0.0
    errors: list[str] = field(default_factory=list)


COLUMNS = ("dockerd", "containerd", "shims", "runc+ctr", "in-ctr", "other", "total")
CGROUP_USAGE = "/sys/fs/cgroup/cpuacct/docker/{id}/cpuacct.usage"
"""cgroup v1, cgroupfs driver: the container's own processes' CPU in ns (gone once removed)."""


class Bench:
    def __init__(self, docker: aiodocker.Docker, sampler: ShimSampler, args: Any) -> None:
        self.docker = docker
        self.sampler = sampler
        self.args = args
        self.dockerd = _pid_of("dockerd")
        self.containerd = _pid_of("containerd")
        self.in_container_ns = 0

    def body(self, variant: Variant) -> Body:
        base = container_config(SandboxConfig(image=IMAGE, labels=LABELS))
        body = copy.deepcopy(base)
        variant.edit(body)
        return body

    async def batch(self, variant: Variant) -> Round:
        body = self.body(variant)
        gate = asyncio.Semaphore(self.args.concurrency)
        result = Round()

        async def one() -> None:
            async with gate:
                try:
                    await self.cycle(variant, body)
                except (DockerError, OSError, RuntimeError) as exc:
                    result.errors.append(repr(exc)[:160])

        self.sampler.take()
        self.in_container_ns = 0
        before = self._snapshot()
        started = time.monotonic()
        await asyncio.gather(*(one() for _ in range(self.args.cycles)))
        wall = time.monotonic() - started
        await asyncio.sleep(0.3)  # the last shims exit
        after = self._snapshot()
        own, reaped = self.sampler.take()
        delta = {k: (after[k] - before[k]) * 1000 / CLK_TCK / self.args.cycles for k in after}
        shims, kids = (t * 1000 / CLK_TCK / self.args.cycles for t in (own, reaped))
        total = delta["busy"] - delta["self"]
        named = delta["dockerd"] + delta["containerd"] + shims + kids
        result.cpu = dict(
            zip(COLUMNS, (delta["dockerd"], delta["containerd"], shims, kids), strict=False)
        )
        in_container = self.in_container_ns / 1e6 / self.args.cycles
        result.cpu.update({"in-ctr": in_container, "other": total - named, "total": total})
        result.wall_ms = wall * 1000 / self.args.cycles
        return result

    def _snapshot(self) -> dict[str, int]:
        times = os.times()
        return {
            "busy": _busy_ticks(),
            "dockerd": sum(_ticks(self.dockerd)),
            "containerd": sum(_ticks(self.containerd)),
            "self": round((times.user + times.system) * CLK_TCK),
        }

    async def cycle(self, variant: Variant, body: Body) -> None:
        container = await self.docker.containers.create(
            body, name=f"shv-bench-{RUN_ID}-{secrets.token_hex(4)}"
        )
        self.sampler.wanted.add(container.id)
        try:
            waiter = None
            if variant.end == "run-like":  # what the docker CLI's attached `run` asks first
                waiter = asyncio.create_task(container.wait(condition="next-exit"))
            channel = await _attached_channel(self.docker, container) if variant.attach else None
            await container.start()
            if variant.setup:
                await self.exercise(container, variant, channel)
            self.in_container_ns += _container_ns(container.id)
            await self.end(container, variant, waiter)
        finally:
            await _force_remove(container)
            self.sampler.wanted.discard(container.id)

    async def exercise(
        self, container: DockerContainer, variant: Variant, channel: ExecChannel | None
    ) -> None:
        argv = ["sh", "-c", SETUP_SCRIPT, "sh", "/testbed"]
        if variant.channel:
            if channel is None:
                channel = await ExecChannel.open(container, 2**20)
            elif not await _ready_or_closed(channel):
                channel = None
            if channel is None:
                raise RuntimeError("the exec channel did not start")
            try:
                done = await channel.exec(
                    argv, workdir="/", env=None, stdin=None, timeout_s=60, on_output=None
                )
            finally:
                await channel.close()
            code = done.exit_code
        else:
            run = await container.exec(argv, workdir="/")
            async with run.start(detach=False) as stream:
                while await stream.read_out() is not None:
                    pass
            code = (await run.inspect())["ExitCode"]
        if code != 0:
            raise RuntimeError(f"setup exited {code}")

    async def end(
        self, container: DockerContainer, variant: Variant, waiter: asyncio.Task[Any] | None
    ) -> None:
        if variant.end == "kill-autoremove":
            gone = asyncio.create_task(container.wait(condition="removed"))
            await asyncio.sleep(0)  # the wait is registered before the kill
            await container.kill()
            await gone
            return
        if variant.end == "stop-delete":
            await container.stop(t=variant.stop_t)
        await _force_remove(container)
        if waiter is not None:
            with contextlib.suppress(DockerError):
                await waiter


async def _attached_channel(docker: aiodocker.Docker, container: DockerContainer) -> ExecChannel:
    """A channel on the container's own stdin/stdout, attached before its start (one request,
    no `docker exec`); aiodocker's `attach` would inspect the container first."""
    query = "stdin=1&stdout=1&stderr=1&stream=1&logs=0&detachKeys="

    async def setup() -> tuple[URL, bytes | None, bool]:
        return URL(f"containers/{container.id}/attach?{query}"), None, False

    stream = Stream(docker, setup)
    stack = contextlib.AsyncExitStack()
    await stack.enter_async_context(stream)
    return ExecChannel(stack, stream, 2**20)


async def _ready_or_closed(channel: ExecChannel) -> bool:
    """True once the attached agent is ready; otherwise the channel is closed."""
    try:
        if await channel.wait_ready(10):
            return True
    except TimeoutError:
        pass
    await channel.close()
    return False


def _container_ns(cid: str) -> int:
    try:
        with open(CGROUP_USAGE.format(id=cid)) as usage:
            return int(usage.read())
    except (OSError, ValueError):
        return 0


async def _force_remove(container: DockerContainer) -> None:
    try:
        await container.delete(force=True, v=True)
    except DockerError as exc:
        if exc.status != 404 and not (exc.status == 409 and "in progress" in exc.message):
            raise


def build_squashed() -> None:
    """The sandbox image as one layer (its config is in our create body: Cmd, Env, WorkingDir)."""
    made = subprocess.run(["docker", "create", IMAGE], capture_output=True, text=True, check=True)
    cid = made.stdout.strip()
    try:
        export = subprocess.Popen(["docker", "export", cid], stdout=subprocess.PIPE)
        subprocess.run(
            ["docker", "import", "-", SQUASHED],
            stdin=export.stdout,
            check=True,
            capture_output=True,
        )
        export.wait()
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)


def layers(image: str) -> int:
    out = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{len .RootFS.Layers}}", image],
        capture_output=True,
        text=True,
        check=False,
    )
    return int(out.stdout.strip() or 0)


def sweep() -> None:
    listed = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=sandhive.bench={RUN_ID}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if ids := listed.stdout.split():
        subprocess.run(["docker", "rm", "-fv", *ids], capture_output=True, check=False)


def table(results: dict[str, list[Round]], median: bool) -> str:
    medians = {name: _pick_round(rounds, median) for name, rounds in results.items()}
    base = medians.get(VARIANTS[0].name)
    head = (
        f"{'variant':<40} | "
        + " | ".join(f"{c:>10}" for c in COLUMNS)
        + " |    wall | docker-side | total | side, all rounds"
    )
    lines = [head, "-" * len(head)]
    for name, row in medians.items():
        if row.errors and all(r.errors for r in results[name]):
            lines.append(f"{name:<40} | failed: {sorted(set(row.errors))[0]}")
            continue
        cells = " | ".join(f"{row.cpu.get(c, 0):>10.1f}" for c in COLUMNS)
        rel = _relative(row, base)
        sides = [_docker_side(r) for r in results[name] if r.cpu and not r.errors]
        spread = f"{min(sides):.0f}-{max(sides):.0f}" if sides else ""
        lines.append(f"{name:<40} | {cells} | {row.wall_ms:>7.0f} | {rel} | {spread:>9}")
        lines.extend(f"    ! {err}" for err in sorted(set(row.errors))[:2])
    return "\n".join(lines)


def _docker_side(row: Round) -> float:
    return sum(row.cpu.get(c, 0) for c in ("dockerd", "containerd", "shims", "runc+ctr"))


def _relative(row: Round, base: Round | None) -> str:
    if base is None or not row.cpu or not base.cpu:
        return ""
    side = (_docker_side(row) / _docker_side(base) - 1) * 100
    total = (row.cpu["total"] / base.cpu["total"] - 1) * 100
    return f"{side:>+10.0f}% | {total:>+4.0f}%"


def _pick_round(rounds: list[Round], median: bool) -> Round:
    """The quietest (or the median) round by docker-side CPU, so a row is one round's."""
    ok = [r for r in rounds if not r.errors] or rounds
    ranked = sorted(ok, key=_docker_side)
    picked = ranked[(len(ranked) - 1) // 2] if median else ranked[0]
    return Round(picked.cpu, picked.wall_ms, [e for r in rounds for e in r.errors])


async def run(args: Any) -> dict[str, list[Round]]:
    chosen = [v for v in VARIANTS if not args.only or any(o in v.name for o in args.only)]
    if VARIANTS[0] not in chosen:
        chosen.insert(0, VARIANTS[0])
    results: dict[str, list[Round]] = {v.name: [] for v in chosen}
    docker = aiodocker.Docker()
    try:
        with ShimSampler() as sampler:
            bench = Bench(docker, sampler, args)
            for n in range(args.rounds):
                for variant in chosen if n % 2 == 0 else reversed(chosen):
                    results[variant.name].append(await bench.batch(variant))
                load = os.getloadavg()[0]
                sys.stderr.write(f"round {n + 1}/{args.rounds} done, load {load:.1f}\n")
    finally:
        await docker.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=[], help="variants whose name contains one")
    parser.add_argument("--median", action="store_true", help="the median round, not the quietest")
    parser.add_argument("--list", action="store_true", help="print the variants and exit")
    args = parser.parse_args()
    if args.list:
        names = (v.name + (" (measure only)" if v.measure_only else "") for v in VARIANTS)
        sys.stdout.write("\n".join(names) + "\n")
        return
    squash = not args.only or any(o in "squashed image (1 layer)" for o in args.only)
    if squash:
        build_squashed()
    load = os.getloadavg()
    try:
        results = asyncio.run(run(args))
    finally:
        sweep()
        if squash:
            subprocess.run(["docker", "rmi", SQUASHED], capture_output=True, check=False)
    sys.stdout.write(
        f"CPU-ms per cycle (create, start, exec channel + setup, end); {args.cycles} cycles"
        f" at {args.concurrency} at once, {'median' if args.median else 'quietest'} of"
        f" {args.rounds} rounds; image layers:"
        f" ours {layers(IMAGE)}; load average {load[0]:.1f} before,"
        f" {os.getloadavg()[0]:.1f} after\n"
    )
    sys.stdout.write(table(results, args.median) + "\n")


if __name__ == "__main__":
    main()
