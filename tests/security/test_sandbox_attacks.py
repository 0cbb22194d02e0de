"""The catalogue's sandbox attacks through the real path (RELIABILITY B1, B2, B3 N-16).

scripted LLM → API → Redis → worker → Docker sandbox, with small limits (pids 64,
memory 256 MiB, disk 64 MiB, 5 s commands). Each attack task runs next to a
canary task; each test asserts the host side (API answers, processes alive, the
cgroup never over its limit, host `MemAvailable` never collapsing and coming
back, no zombie left unreaped by a sandbox's init nor outliving its sandbox, no
inbound exposure), the canary's success within a bound of its own run time
measured alone in the same test, and that the attacked task got a readable
observation or ended cleanly, its container gone.
"""

from __future__ import annotations

import io
import re
import subprocess
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.support.processes import Service, running_service
from tests.support.settings import SPARE_REDIS_URL

PIDS = 64
MEMORY_MB = 256
DISK_MB = 64
SCRATCH_MB = 32
LLM_KEY = "sk-canary-llm-key-0123456789"
SANDBOX = {"memory_mb": MEMORY_MB, "disk_mb": DISK_MB, "cpus": 1.0}
LIMITS = {"command_timeout_s": 5, "timeout_s": 120, "max_steps": 30}
CGROUP = Path("/sys/fs/cgroup")
EXEC_SLACK = 2


PRIVATE_REDIS = SPARE_REDIS_URL
"""A Redis DB of these tests' own (tests/support/settings.py): a long run must not share its
DB with the tests that flush the main one."""


RUNTIMES = ["runc", "crun"]
"""Every attack runs in a sandbox of each OCI runtime deploy/setup-host.sh registers."""


@pytest.fixture(params=RUNTIMES)
def attack_settings(settings: Settings, request: pytest.FixtureRequest) -> Settings:
    client = redis.Redis.from_url(PRIVATE_REDIS)
    client.flushdb()
    client.close()
    return settings.model_copy(
        update={
            "redis_url": PRIVATE_REDIS,
            "sandbox_runtime": request.param,
            "sandbox_pids_limit": PIDS,
            "sandbox_scratch_mb": SCRATCH_MB,
            "worker_concurrency": 3,
            "llm_api_key": LLM_KEY,
            "admin_api_key": "admin-canary-secret-987",
            "artifact_max_files": 20,
            "artifact_max_file_bytes": 256 * 2**10,
            "artifact_max_total_bytes": 2**20,
        }
    )


@pytest.fixture
def service(attack_settings: Settings, tmp_path: Path) -> Iterator[Service]:
    with running_service(attack_settings, tmp_path) as svc:
        yield svc


def bash(command: str) -> Turn:
    return Turn(tool="execute_bash", arguments={"command": command})


def answer_and_submit(text: str) -> list[Turn]:
    return [
        Turn(
            tool="str_replace_editor",
            arguments={
                "command": "create",
                "path": "/testbed/output/answer.txt",
                "file_text": text,
            },
        ),
        Turn(tool="submit", arguments={}),
    ]


def canary_script() -> Script:
    steps = [bash(f"sleep 1; echo canary-{i}") for i in range(5)]
    return Script(turns=[*steps, *answer_and_submit("canary ok")])


def submit(client: httpx.Client, model: str, **extra: Any) -> str:
    body = {"prompt": "attack", "llm": {"model": model}, "sandbox": SANDBOX, "limits": LIMITS}
    response = client.post("/v1/tasks", json={**body, **extra})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def wait_finished(client: httpx.Client, task_id: str, timeout_s: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    task: dict[str, Any] = {}
    while time.monotonic() < deadline:
        task = client.get(f"/v1/tasks/{task_id}").json()
        if task["status"] not in ("queued", "running"):
            return task
        time.sleep(0.3)
    raise AssertionError(f"task {task_id} did not finish in {timeout_s} s: {task}")


def containers_of(task_id: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--no-trunc", "--filter", f"label=sandhive.task={task_id}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def wait_removed(task_id: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while containers_of(task_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert containers_of(task_id) == [], f"the sandbox of {task_id} outlived its task"


def observations(client: httpx.Client, task_id: str) -> list[str]:
    steps = client.get(f"/v1/tasks/{task_id}/trajectory").json()["steps"]
    return [step["observation"] for step in steps]


@dataclass
class HostWatch:
    """Samples the host while attacks run: the API's health and each sandbox's cgroups."""

    base_url: str
    tasks: list[str]
    health: list[int] = field(default_factory=list)
    pids_max_seen: int = 0
    pids_over: list[str] = field(default_factory=list)
    memory_peak: dict[str, int] = field(default_factory=dict)
    memory_limit: dict[str, int] = field(default_factory=dict)
    memory_failcnt: dict[str, int] = field(default_factory=dict)
    """How often each sandbox's memory cgroup refused a charge at its limit."""
    throttled: dict[str, int] = field(default_factory=dict)
    cpu_quota: dict[str, float] = field(default_factory=dict)
    """Each sandbox's CPU quota in its cgroup, in CPUs (cfs_quota_us / cfs_period_us)."""
    cpu_rate_max: dict[str, float] = field(default_factory=dict)
    """Each sandbox's highest CPU use between two samples, in CPUs."""
    cpu_used: dict[str, tuple[int, int]] = field(default_factory=dict)
    mem_available: list[int] = field(default_factory=list)
    """Host `MemAvailable` (bytes), one per round."""
    containers: set[str] = field(default_factory=set)
    """Every sandbox of the watched tasks seen running."""
    init_pid: dict[str, int] = field(default_factory=dict)
    """Each sandbox's init (its PID 1) as a host PID."""
    runtime: dict[str, str] = field(default_factory=dict)
    """Each sandbox's OCI runtime, as the daemon ran it."""
    orphan_zombies: dict[tuple[int, int], tuple[str, float, float]] = field(default_factory=dict)
    """Zombies whose parent is a sandbox's init, by (pid, start): (sandbox, first, last seen)."""
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=10) as client:
            while not self.stop.is_set():
                try:
                    self.health.append(client.get("/healthz").status_code)
                except httpx.HTTPError:
                    self.health.append(0)
                available = mem_available()
                if available is not None:
                    self.mem_available.append(available)
                for task_id in self.tasks:
                    for cid in containers_of(task_id):
                        self.containers.add(cid)
                        self.sample(cid)
                        self.sample_zombies(cid)
                time.sleep(0.5)

    def sample_zombies(self, cid: str) -> None:
        """Zombies in the sandbox that its init should have reaped (their parent is init)."""
        if cid not in self.init_pid:
            pid, _, runtime = (
                subprocess.run(
                    ["docker", "inspect", "-f", "{{.State.Pid}} {{.HostConfig.Runtime}}", cid],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                .stdout.strip()
                .partition(" ")
            )
            if not pid.isdigit() or pid == "0":
                return
            self.init_pid[cid] = int(pid)
            self.runtime[cid] = runtime
        init = self.init_pid[cid]
        try:  # a zombie has left its cgroup's list, not its parent's
            pids = Path(f"/proc/{init}/task/{init}/children").read_text().split()
        except OSError:
            return
        now = time.monotonic()
        for pid in pids:
            stat = proc_stat(int(pid))
            if stat is None:
                continue
            state, ppid, started = stat
            if state == "Z" and ppid == init:
                key = (int(pid), started)
                first = self.orphan_zombies.get(key, (cid, now, now))[1]
                self.orphan_zombies[key] = (cid, first, now)

    def lingering_zombies(self, grace_s: float) -> list[str]:
        """Zombies left to init that stayed unreaped for longer than `grace_s`."""
        return [
            f"{cid[:12]} pid {pid}: {last - first:.1f} s"
            for (pid, _), (cid, first, last) in self.orphan_zombies.items()
            if last - first > grace_s
        ]

    def sample(self, cid: str) -> None:
        pids = read_int(CGROUP / "pids/docker" / cid / "pids.current")
        limit = read_int(CGROUP / "pids/docker" / cid / "pids.max")
        if pids is not None and limit is not None:
            self.pids_max_seen = max(self.pids_max_seen, pids)
            # A `docker exec` joins the cgroup (a move, not a fork), which the kernel lets
            # pass the limit: one or two over is our own exec (a command, or the kill).
            if pids > limit + EXEC_SLACK:
                self.pids_over.append(f"{cid[:12]}: {pids} > {limit}")
        memory = CGROUP / "memory/docker" / cid
        peak = read_int(memory / "memory.max_usage_in_bytes")
        mem_limit = read_int(memory / "memory.limit_in_bytes")
        if peak is not None and mem_limit is not None:
            self.memory_peak[cid] = max(self.memory_peak.get(cid, 0), peak)
            self.memory_limit[cid] = mem_limit
        failcnt = read_int(memory / "memory.failcnt")
        if failcnt is not None:
            self.memory_failcnt[cid] = max(self.memory_failcnt.get(cid, 0), failcnt)
        cpu = CGROUP / "cpu/docker" / cid
        try:
            stats = dict(line.split() for line in (cpu / "cpu.stat").read_text().splitlines())
            self.throttled[cid] = int(stats["nr_throttled"])
        except (OSError, KeyError, ValueError):
            pass
        quota, period = read_int(cpu / "cpu.cfs_quota_us"), read_int(cpu / "cpu.cfs_period_us")
        if quota is not None and period:
            self.cpu_quota[cid] = quota / period
        used, now = read_int(CGROUP / "cpuacct/docker" / cid / "cpuacct.usage"), time.monotonic_ns()
        if used is not None:
            if cid in self.cpu_used:
                was, then = self.cpu_used[cid]
                rate = (used - was) / max(now - then, 1)
                self.cpu_rate_max[cid] = max(self.cpu_rate_max.get(cid, 0.0), rate)
            self.cpu_used[cid] = (used, now)


def mem_available() -> int | None:
    """The host's `MemAvailable` in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time in ticks) of a host process, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    return fields[0], int(fields[1]), int(fields[19])


def zombies_of(container_ids: set[str]) -> list[str]:
    """Zombie processes anywhere on the host that belonged to one of these sandboxes."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = proc_stat(int(entry.name))
        if stat is None or stat[0] != "Z":
            continue
        try:
            cgroups = (entry / "cgroup").read_text()
        except OSError:
            continue
        if any(cid in cgroups for cid in container_ids):
            found.append(f"pid {entry.name} ppid {stat[1]}")
    return found


def run_time(task: dict[str, Any]) -> float:
    """Seconds from the task's start in a worker to its end (queueing excluded)."""
    started = datetime.fromisoformat(task["started_at"])
    return (datetime.fromisoformat(task["finished_at"]) - started).total_seconds()


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


@pytest.fixture
def watch(service: Service) -> Iterator[HostWatch]:
    watcher = HostWatch(service.base_url, [])
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    yield watcher
    watcher.stop.set()
    thread.join(timeout=30)


ZOMBIE_GRACE_S = 5.0
"""A zombie left to a sandbox's init must be reaped well within this (tini reaps at once)."""
ZOMBIE_MAKER = bash(
    "python3 -c 'import os, time\nfor _ in range(20):\n    if os.fork() == 0:\n"
    "        time.sleep(0.2)\n        os._exit(0)\nos._exit(0)'; "
    "sleep 2; echo zombies: $(ps -eo stat= | grep -c ^Z)"  # well inside the 5 s command limit
)
MEMORY_SLACK = 2 * 2**30
"""Room for the rest of this shared machine (other tests, helpers) moving `MemAvailable`."""
CANARY_FACTOR = 3.0
CANARY_SLACK_S = 30.0
"""The canary beside the attacks may take CANARY_FACTOR x its run time alone, plus this."""

RESOURCE_ATTACKS = [
    # S-02 memory bomb: 64 MiB chunks up to 4x the limit
    bash("python3 -c 'x = []\nwhile True: x.append(bytearray(64 * 2**20))'"),
    # S-04 disk fill of /testbed (10x the cap), then a write to the read-only image
    bash("dd if=/dev/zero of=/testbed/fill bs=1M count=640; df -k /testbed; rm -f /testbed/fill"),
    # S-03 scratch tmpfs fill, /dev/shm fill, and writes to the image
    bash(
        "dd if=/dev/zero of=/tmp/fill bs=1M count=640; rm -f /tmp/fill; "
        "dd if=/dev/zero of=/dev/shm/fill bs=1M count=640; rm -f /dev/shm/fill; "
        "echo x > /usr/local/x; echo x > /etc/x"
    ),
    # S-05 output flood: a 30 MB line without newline, then `yes` until killed
    bash("head -c 30000000 /dev/zero | tr '\\0' x; echo; timeout 3 yes | head -c 100000000"),
    bash("head -c 5000000 /dev/urandom"),  # binary, invalid UTF-8, NULs
    # S-06 CPU spin: 4 busy loops in a 1-CPU sandbox
    bash("for i in 1 2 3 4; do timeout 3 sh -c 'while :; do :; done' & done; wait; echo spun"),
    # S-08 a SIGTERM-ignoring runaway, then a double-forked daemon
    bash("trap '' TERM; sleep 100"),
    bash("setsid sh -c 'trap \"\" TERM HUP; sleep 1000' >/dev/null 2>&1 & echo daemon started"),
    # S-08 a parent that exits at once, leaving 20 children that exit unwaited for: init's
    ZOMBIE_MAKER,
    # A-38 an output bomb: many files, a deep tree, a big file, odd names, a symlink
    bash(
        "cd /testbed/output && for i in $(seq 300); do echo $i > f$i.txt; done; "
        "head -c 3000000 /dev/zero > big.bin; d=deep; for i in $(seq 120); do d=$d/d; done; "
        "mkdir -p $d && echo x > $d/leaf; printf x > \"$(printf '0new\\nline')\"; "
        "ln -s /etc/passwd link; mkfifo fifo; echo made"
    ),
    bash("echo still usable; ps -e | wc -l"),
]


def test_resource_attacks_stay_inside_their_sandbox(
    service: Service, scripted_llm: ScriptedLLMServer, watch: HostWatch, attack_settings: Settings
) -> None:
    scripted_llm.add_script(
        "attack-resources", Script([*RESOURCE_ATTACKS, *answer_and_submit("alive")])
    )
    scripted_llm.add_script("attack-forkbomb", fork_bomb_script())
    scripted_llm.add_script("attack-canary", canary_script())
    scripted_llm.add_script("attack-canary-alone", canary_script())
    with httpx.Client(base_url=service.base_url, timeout=30) as client:
        # Baselines on the same machine, moments before: the canary alone (C0), MemAvailable.
        alone = wait_finished(client, submit(client, "attack-canary-alone"))
        assert alone["status"] == "succeeded", alone
        memory_before = mem_available()
        assert memory_before is not None
        attacked = submit(client, "attack-resources")
        bomb = submit(client, "attack-forkbomb", limits={**LIMITS, "timeout_s": 30})
        canary = submit(client, "attack-canary")
        watch.tasks += [attacked, bomb, canary]
        started = time.monotonic()
        done = {task_id: wait_finished(client, task_id) for task_id in (attacked, bomb, canary)}
        elapsed = time.monotonic() - started
        seen = observations(client, attacked)
        bomb_seen = observations(client, bomb)
        artifacts = client.get(f"/v1/tasks/{attacked}/artifacts").json()
        archive = client.get(f"/v1/tasks/{attacked}/artifacts.zip").content
        downloads = [
            client.get(f"/v1/tasks/{attacked}/artifacts/{quote(item['path'])}").status_code
            for item in artifacts["items"]
        ]
    for task_id in (attacked, bomb, canary):
        wait_removed(task_id)
    time.sleep(3)  # the sandboxes are gone: give the kernel a moment to hand their memory back
    memory_after = max(mem_available() or 0 for _ in range(3))
    canary_alone, canary_beside = run_time(alone), run_time(done[canary])
    print(
        f"attacks took {elapsed:.0f} s; pids peak {watch.pids_max_seen}/{PIDS}; memory peaks "
        f"{[p // 2**20 for p in watch.memory_peak.values()]} MiB; throttled {watch.throttled}; "
        f"CPU peaks {[round(r, 2) for r in watch.cpu_rate_max.values()]}; "
        f"MemAvailable before {memory_before >> 20} min {min(watch.mem_available) >> 20} "
        f"after {memory_after >> 20} MiB; canary alone {canary_alone:.1f} s, beside the attacks "
        f"{canary_beside:.1f} s; orphan zombies seen {len(watch.orphan_zombies)}"
    )
    logs = service.logs()
    print("attacked:", done[attacked]["status"], done[attacked]["error"], seen[-2:])

    # The canary and the host did not notice.
    assert (done[canary]["status"], done[canary]["answer"]) == ("succeeded", "canary ok"), logs
    assert watch.health
    assert set(watch.health) == {200}, watch.health
    assert service.api.poll() is None
    assert service.worker.poll() is None
    assert canary_beside <= CANARY_FACTOR * canary_alone + CANARY_SLACK_S, (
        canary_beside,
        canary_alone,
    )
    # Host memory never collapsed (the sandboxes may hold at most their limits) and came back.
    held = 3 * (MEMORY_MB + DISK_MB) * 2**20
    assert min(watch.mem_available) >= memory_before - held - MEMORY_SLACK
    assert min(watch.mem_available) > 4 * 2**30  # RELIABILITY S-02
    assert memory_after >= memory_before - MEMORY_SLACK
    # No zombie outlived its sandbox, and init reaped the ones left to it (S-08).
    assert watch.containers
    assert len(watch.init_pid) == len(watch.containers)
    assert set(watch.runtime.values()) == {attack_settings.sandbox_runtime}
    assert watch.lingering_zombies(ZOMBIE_GRACE_S) == []
    assert zombies_of(watch.containers) == []
    assert watch.pids_over == []
    assert PIDS - 8 <= watch.pids_max_seen <= PIDS + EXEC_SLACK  # the bomb hit the cap
    for cid, peak in watch.memory_peak.items():
        assert peak <= watch.memory_limit[cid] * 1.05, cid
    # The CPU quota bit: each sandbox's cgroup holds its quota, and the spin either hit it
    # (throttled) or never got more than it (a loaded host may not give four busy loops a
    # whole CPU; without the quota an idle host gives them both cores).
    assert set(watch.cpu_quota.values()) == {SANDBOX["cpus"]}, watch.cpu_quota
    assert watch.cpu_rate_max, "no CPU use was sampled"
    assert max(watch.throttled.values()) > 0 or max(watch.cpu_rate_max.values()) <= 1.1 * float(
        SANDBOX["cpus"]
    ), (watch.throttled, watch.cpu_rate_max)

    # The attacked task saw what happened, and went on to the end.
    task = done[attacked]
    assert (task["status"], task["finish_reason"], task["answer"]) == (
        "succeeded",
        "submitted",
        "alive",
    ), (task["error"], seen, logs[-5000:])
    memory, disk, scratch, flood, binary, cpu, runaway, daemon, zombies, bomb_out, alive = seen[:11]
    # The bomb is OOM-killed (137) once the kernel gives up reclaiming. On a loaded host that
    # reclaim (of the sandbox's own file pages) can outlast the 5 s command timeout: then the
    # command times out instead, and the cgroup must show it was held at its limit.
    assert (
        "137" in memory
        or "Killed" in memory
        or ("took too long" in memory and max(watch.memory_failcnt.values()) > 0)
    ), (memory, watch.memory_failcnt)
    assert "No space left on device" in disk
    assert "No space left on device" in scratch
    assert scratch.count("Read-only file system") == 2
    assert len(flood.encode()) < 200_000  # 30 MB in, a capped observation out
    assert "truncated" in flood.lower()
    assert len(binary.encode()) < 200_000
    assert "spun" in cpu
    assert "took too long" in runaway
    assert "daemon started" in daemon
    assert "zombies: 0" in zombies, zombies  # init (Init=true) reaped the orphans
    assert "made" in bomb_out
    assert "still usable" in alive

    # Artifact caps held while reading the hostile output.
    items = artifacts["items"]
    assert 0 < len(items) <= 20
    assert all(item["size"] <= 256 * 2**10 for item in items)
    assert sum(item["size"] for item in items) <= 2**20
    assert not {"link", "fifo"} & {item["path"] for item in items}
    assert downloads == [200] * len(items)  # whatever the names, every listed artifact downloads
    assert {"path": "0new\\x0aline", "reason": "unusable file name"} in artifacts["skipped"]
    names = zipfile.ZipFile(io.BytesIO(archive)).namelist()
    assert all(not n.startswith("/") and ".." not in n.split("/") for n in names)

    # The fork bomb's task ended cleanly (its sandbox may stay saturated until then).
    assert done[bomb]["status"] in ("succeeded", "failed"), done[bomb]
    assert done[bomb]["finish_reason"] in ("submitted", "timeout", "max_steps"), done[bomb]
    assert re.search(r"fork|Resource temporarily unavailable|took too long", " ".join(bomb_seen))


def fork_bomb_script() -> Script:
    """S-01: a shell fork bomb, then a thread bomb, then a probe that repeats until the end."""
    return Script(
        turns=[
            # The call returns 0.5 s after its shell exits and the bomb then dies of SIGPIPE
            # on its fork errors; the sleep keeps it going until the command timeout, so
            # the pids watcher (sampling every 0.5 s or so) sees the cap being held.
            bash(":(){ :|:& };:; sleep 30"),
            bash(
                "python3 -c 'import threading, time\nwhile True: "
                "threading.Thread(target=time.sleep, args=(30,)).start()'"
            ),
            bash("cat /sys/fs/cgroup/pids/pids.max; ps -e | wc -l"),
        ],
        repeat_last=True,
    )


@pytest.fixture
def listener_ip() -> Iterator[str]:
    """A container of the test's own on a network of the test's own: a target to try to reach."""
    name = f"shv-test-listener-{time.monotonic_ns()}"
    subprocess.run(["docker", "network", "create", name], check=True, capture_output=True)
    try:
        subprocess.run(
            [
                "docker",
                "run",
                "-d",
                "--rm",
                "--name",
                name,
                "--network",
                name,
                "sandhive-sandbox:latest",
                "python3",
                "-m",
                "http.server",
                "8080",
            ],
            check=True,
            capture_output=True,
        )
        ip = subprocess.run(
            [
                "docker",
                "inspect",
                "-f",
                "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                name,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        yield ip
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
        subprocess.run(["docker", "network", "rm", name], capture_output=True, check=False)


N20_PORT = 8000
N20_TOKEN = "n20-token-6f1d2c"
"""Served by the sandbox's listener: only that listener can answer with it."""


def exposure_listeners(sandbox_ips: set[str]) -> set[str]:
    """Host TCP listeners a sandbox could have caused: a `docker-proxy` forwarding to one of its
    addresses (a published port), one of `dockerd`'s own, and any on the sandbox's port off
    loopback. Every other listener on this shared machine (other tests, other containers'
    published ports, helpers) is not the sandbox's doing."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        local, owner = parts[3], " ".join(parts[5:])
        address, _, port = local.rpartition(":")
        loopback = address.strip("[]").startswith("127.") or address.strip("[]") == "::1"
        proxied = re.search(r'\("docker-proxy",pid=(\d+)', owner)
        if proxied:
            ours = proxy_target(int(proxied.group(1))) in sandbox_ips
        else:
            ours = '"dockerd"' in owner or (port == str(N20_PORT) and not loopback)
        if ours:
            found.add(f"{local} {owner}")
    return found


def proxy_target(pid: int) -> str:
    """The container address a `docker-proxy` forwards to ("" if it is gone)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return ""
    return argv[argv.index("-container-ip") + 1] if "-container-ip" in argv else ""


def sandbox_addresses(container_ids: list[str]) -> set[str]:
    """Every address the sandboxes have on Docker networks (none with network `none`)."""
    fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}"
    found: set[str] = set()
    for cid in container_ids:
        out = subprocess.run(
            ["docker", "inspect", "-f", fmt, cid], capture_output=True, text=True, check=False
        )
        found.update(out.stdout.split())
    return found


def answers_with_token(address: str) -> str:
    """What the host gets asking `address:N20_PORT` for the sandbox's token ("" when nothing)."""
    host = f"[{address}]" if ":" in address else address
    try:
        response = httpx.get(f"http://{host}:{N20_PORT}/{N20_TOKEN}.txt", timeout=2)
    except httpx.HTTPError:
        return ""
    return response.text if N20_TOKEN in response.text else ""


def published_ports(container_id: str) -> list[str]:
    """A container's port publishing as Docker records it; all empty when nothing is exposed."""
    fmt = "{{json .HostConfig.PortBindings}} {{json .NetworkSettings.Ports}} "
    fmt += "{{.HostConfig.PublishAllPorts}}"
    out = subprocess.run(
        ["docker", "inspect", "-f", fmt, container_id], capture_output=True, text=True, check=True
    ).stdout.split()
    return [item for item in out if item not in ("{}", "null", "false")]


def host_addresses() -> list[str]:
    """Every address of this machine's interfaces (IPv4 and IPv6, link-local left out)."""
    out = subprocess.run(
        ["ip", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    addresses = [line.split()[3].split("/")[0] for line in out.splitlines()]
    return [a for a in addresses if not a.startswith("fe80:")]


def probe_script(listener: str) -> Script:
    probes = [
        # I-10: what the process holds
        bash("grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; id -u"),
        # I-10: namespace, mount and cgroup tricks (CVE-2022-0492 class)
        bash(
            "mount -t tmpfs none /mnt; unshare -U -r true; unshare -m true; "
            "mkdir -p /tmp/cg && mount -t cgroup -o memory cgroup /tmp/cg; "
            "mkdir /sys/fs/cgroup/memory/x; echo 1 > /sys/fs/cgroup/memory/notify_on_release; "
            "echo probes-done"
        ),
        # I-10: raw sockets, devices, ownership, kernel interfaces
        bash(
            "python3 -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)' 2>&1"
            " | tail -1; "
            "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)' 2>&1"
            " | tail -1; "
            "mknod /tmp/mem c 1 1; echo b > /proc/sysrq-trigger; echo 1 > /proc/sys/kernel/panic; "
            "head -c 16 /proc/kcore | wc -c; echo 9 > /sys/fs/cgroup/pids/pids.max; "
            "echo probes2-done"
        ),
        # I-11: a setuid binary run by an unprivileged user gains nothing
        bash(
            "cp /usr/bin/id /testbed/idx && chmod u+s /testbed/idx; "
            "setpriv --reuid=65534 --regid=65534 --clear-groups /testbed/idx -u; "
            "setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/mount -t tmpfs x /mnt; "
            "setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/su -c id root </dev/null; "
            "echo suid-done"
        ),
        # I-12: no Docker control plane anywhere
        bash(
            "ls -l /var/run/docker.sock /run/docker.sock /run/containerd/containerd.sock; "
            "echo sockets: $(find / -xdev -type s 2>/dev/null | wc -l); "
            "echo mounted: $(grep -c -e docker.sock -e containerd /proc/self/mountinfo); "
            "echo docker-env: $(env | grep -ci docker)"
        ),
        # N-16: only loopback, nothing reachable, no resolver
        bash(
            "echo ifaces: $(tail -n +3 /proc/net/dev | cut -d: -f1); "
            f"python3 -c \"import socket; socket.create_connection(('{listener}', 8080), 2)\" 2>&1"
            " | tail -1; getent hosts postgres redis api || echo no-names"
        ),
        # Invariant 5: nothing of the service's configuration or secrets inside
        bash(
            "env | sort; echo ---; tr '\\0' '\\n' < /proc/1/environ; echo ---; "
            "grep -rIl -e sk-canary-llm-key -e admin-canary-secret /etc /root /testbed /tmp /run "
            "/var /opt /usr/local 2>/dev/null; echo secrets-done"
        ),
        bash("cat /proc/self/mountinfo"),
        # N-20: a listener inside (every address, IPv4 and IPv6) is not exposed anywhere; it
        # answers inside, so a host that could reach it would get the token.
        bash(
            f"mkdir -p /tmp/n20 && echo {N20_TOKEN} > /tmp/n20/{N20_TOKEN}.txt && "
            f"(cd /tmp/n20 && python3 -m http.server {N20_PORT} >/dev/null 2>&1 &) ; sleep 1; "
            "python3 -c \"import urllib.request as u; print('inside:', u.urlopen("
            f"'http://127.0.0.1:{N20_PORT}/{N20_TOKEN}.txt', timeout=5).read().decode())\"; "
            "echo listening"
        ),
        bash("sleep 4; echo done"),
    ]
    return Script([*probes, *answer_and_submit("probed")])


def test_privilege_control_plane_network_and_secret_probes_all_fail(
    service: Service,
    scripted_llm: ScriptedLLMServer,
    watch: HostWatch,
    listener_ip: str,
    attack_settings: Settings,
) -> None:
    scripted_llm.add_script("attack-probes", probe_script(listener_ip))
    scripted_llm.add_script("attack-canary-2", canary_script())
    with httpx.Client(base_url=service.base_url, timeout=30) as client:
        before = exposure_listeners(set())  # on port 8000 off loopback: someone else's
        # The probes attack nothing that needs the 5 s cap; `find /` over the image may take
        # longer on a loaded host, so they get more time.
        probed = submit(client, "attack-probes", limits={**LIMITS, "command_timeout_s": 30})
        canary = submit(client, "attack-canary-2")
        watch.tasks += [probed, canary]
        # N-20, while the sandbox listens (the next step sleeps 4 s): no listener of Docker's
        # and none on the port off loopback appeared, nothing is published, and no host
        # address answers with what the sandbox serves.
        deadline = time.monotonic() + 60
        while len(observations(client, probed)) < 9 and time.monotonic() < deadline:
            time.sleep(0.3)
        boxes = containers_of(probed)
        exposed = exposure_listeners(sandbox_addresses(boxes)) - before
        ports = [port for cid in boxes for port in published_ports(cid)]
        answered = {a: answers_with_token(a) for a in ["127.0.0.1", *host_addresses()]}
        task = wait_finished(client, probed)
        canary_task = wait_finished(client, canary)
        seen = observations(client, probed)
    assert (task["status"], task["answer"]) == ("succeeded", "probed"), (task, seen)
    assert (canary_task["status"], canary_task["answer"]) == ("succeeded", "canary ok")
    assert exposed == set(), exposed
    assert boxes, "the probed sandbox was gone before N-20 could look at it"
    assert set(watch.runtime.values()) == {attack_settings.sandbox_runtime}
    assert ports == [], ports
    assert {a: text for a, text in answered.items() if text} == {}
    assert f"inside: {N20_TOKEN}" in seen[8], seen[8]  # it did listen, inside
    status, tricks, kernel, setuid, control, network, env, mounts = seen[:8]

    assert "CapEff:\t00000000a80000fb" not in status  # not Docker's default set ...
    fields = dict(line.split(":\t") for line in status.splitlines() if ":\t" in line)
    assert int(fields["CapEff"], 16) & ~EXPECTED_CAPS == 0  # ... only the allow-list
    assert fields["CapBnd"] == fields["CapEff"]
    assert fields["NoNewPrivs"] == "1"
    assert fields["Seccomp"] == "2"
    assert tricks.count("Operation not permitted") + tricks.count("permission denied") >= 3, tricks
    assert tricks.count("Read-only file system") == 2, tricks  # the cgroup hierarchy is ro
    assert kernel.count("Operation not permitted") >= 3, kernel  # AF_PACKET, raw ICMP, mknod
    assert kernel.count("Read-only file system") >= 2, kernel  # sysrq, /proc/sys, cgroupfs
    assert "\n0\n" in kernel or "Permission denied" in kernel  # /proc/kcore gives nothing
    assert "65534" in setuid  # the setuid copy ran as nobody: nosuid mount, no-new-privileges
    assert "must be superuser" in setuid or "Operation not permitted" in setuid
    assert "No such file or directory" in control
    assert "sockets: 0" in control
    assert "mounted: 0" in control
    assert "docker-env: 0" in control
    assert "ifaces: lo" in network
    assert "Network is unreachable" in network, network
    assert "no-names" in network
    assert "sk-canary-llm-key" not in env
    assert "admin-canary-secret" not in env
    assert "SANDHIVE_" not in env.replace("SANDHIVE_EXEC_ID", "")  # only the per-command mark
    assert env.rstrip().endswith("secrets-done")
    assert "docker.sock" not in mounts
    assert " /testbed " in mounts
    wait_removed(probed)
    wait_removed(canary)


EXPECTED_CAPS = sum(
    1 << bit for bit in (0, 1, 3, 4, 5, 6, 7)
)  # CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID
