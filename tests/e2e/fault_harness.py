"""The fault-injection harness: real API and worker processes, a private Redis, real signals.

Every fault test runs `python -m app serve|worker` subprocesses against the
session's Postgres database, a Redis server of its own (so killing or
restarting it disturbs nobody) and the Docker daemon; the only stand-in is the
scripted LLM. `check_consistency` is the invariant checker run after each test
(RELIABILITY-SECURITY.md B0.7).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import redis

from app.config import Settings
from tests.support.processes import free_port, settings_env
from tests.support.zygote import AppProcess

TERMINAL = ("succeeded", "failed", "cancelled")


@dataclass
class Cluster:
    """The processes of one test; everything started is stopped at the end."""

    settings: Settings
    log_dir: Path
    port: int = field(default_factory=free_port)
    procs: list[AppProcess] = field(default_factory=list)
    api: AppProcess | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start_api(self) -> AppProcess:
        proc = self._spawn(["serve", "--port", str(self.port)], "api", self.settings)
        self.api = proc
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"API exited early:\n{self.logs()}")
            try:
                if httpx.get(f"{self.base_url}/healthz", timeout=1).status_code == 200:
                    return proc
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"API not up after 30 s:\n{self.logs()}")

    def start_worker(self, name: str, **overrides: Any) -> AppProcess:
        settings = self.settings.model_copy(update={"worker_name": name, **overrides})
        return self._spawn(["worker"], name, settings)

    def _spawn(self, args: list[str], name: str, settings: Settings) -> AppProcess:
        with (self.log_dir / f"{name}.log").open("ab") as out:
            proc = AppProcess(
                args, env=settings_env(settings), stdout=out, stderr=subprocess.STDOUT
            )
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(
            f"==== {p.name}\n{p.read_text(errors='replace')[-20000:]}"
            for p in sorted(self.log_dir.glob("*.log"))
        )

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def cluster(settings: Settings, log_dir: Path) -> Iterator[Cluster]:
    running = Cluster(settings, log_dir)
    try:
        yield running
    finally:
        running.stop_all()


@contextmanager
def cluster_with_api(settings: Settings, log_dir: Path) -> Iterator[tuple[Cluster, httpx.Client]]:
    """A cluster whose API is up, and a client of it: the start of most fault tests."""
    with cluster(settings, log_dir) as procs:
        procs.start_api()
        with httpx.Client(base_url=procs.base_url, timeout=10) as client:
            yield procs, client


def fault_settings(base: Settings, redis_url: str, **overrides: Any) -> Settings:
    """Short leases and intervals so faults show within seconds; defaults stay production-sane."""
    values: dict[str, Any] = {
        "redis_url": redis_url,
        "auth": "disabled",
        "worker_concurrency": 2,
        "worker_lease_s": 3.0,
        "worker_heartbeat_s": 0.5,
        "worker_reconcile_interval_s": 2.0,
        "worker_reap_interval_s": 2.0,
        "worker_cancel_poll_s": 0.2,
        "worker_shutdown_grace_s": 20.0,
        **overrides,
    }
    return base.model_copy(update=values)


# Reading the outcome


def submit(client: httpx.Client, model: str, **extra: Any) -> str:
    response = client.post(
        "/v1/tasks", json={"prompt": "compute", "llm": {"model": model}, **extra}
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def wait_until(
    what: str, probe: Callable[[], Any], timeout_s: float, interval_s: float = 0.2
) -> Any:
    """Poll until probe() is truthy (and return it); a liveness bound, not a performance one."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def wait_terminal(client: httpx.Client, task_id: str, timeout_s: float = 90) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        task: dict[str, Any] = client.get(f"/v1/tasks/{task_id}").json()
        return task if task.get("status") in TERMINAL else None

    result: dict[str, Any] = wait_until(f"task {task_id} to finish", finished, timeout_s, 0.3)
    return result


def db_events(database_url: str, task_id: str) -> list[dict[str, Any]]:
    rows = _sql(
        database_url,
        "SELECT seq, type, data::text AS data FROM events WHERE task_id = $1 ORDER BY seq",
        task_id,
    )
    return [{"seq": r["seq"], "type": r["type"], "data": json.loads(r["data"])} for r in rows]


def event_types(database_url: str, task_id: str) -> list[str]:
    return [event["type"] for event in db_events(database_url, task_id)]


def _sql(database_url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    async def fetch() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(database_url.replace("+asyncpg", ""))
        try:
            return list(await conn.fetch(query, *args))
        finally:
            await conn.close()

    return asyncio.run(fetch())


def containers(label: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={label}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def containers_left(label: str, settle_s: float = 10.0) -> list[str]:
    """The containers with `label` still there once a removal has had `settle_s` to end: a
    finished task's sandbox goes in the background, just after the task's end is stored."""
    deadline = time.monotonic() + settle_s
    while (left := containers(label)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def host_processes(marker: str) -> list[str]:
    """PIDs on the host whose command line contains marker (sandbox processes are visible here)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(cmdline.parent.name)
        except OSError:  # the process ended meanwhile
            continue
    return found


def events_by_task(database_url: str, task_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The durable events of many tasks in one query, each task's in seq order."""
    rows = _sql(
        database_url,
        "SELECT task_id, seq, type, data::text AS data FROM events"
        " WHERE task_id = ANY($1) ORDER BY task_id, seq",
        task_ids,
    )
    found: dict[str, list[dict[str, Any]]] = {task_id: [] for task_id in task_ids}
    for r in rows:
        found[r["task_id"]].append(
            {"seq": r["seq"], "type": r["type"], "data": json.loads(r["data"])}
        )
    return found


def check_consistency(
    settings: Settings, task_ids: list[str], redis_client: redis.Redis | None = None
) -> None:
    """The invariants every fault test ends with (RELIABILITY-SECURITY.md B0.7)."""
    url = settings.database_url
    tasks = {r["id"]: r for r in _sql(url, "SELECT * FROM tasks WHERE id = ANY($1)", task_ids)}
    step_rows = _sql(
        url,
        # Usage counts the model's answers: a step cut while the model was still answering
        # is stored (interrupted, with no action) but has no answer to count.
        "SELECT s.task_id, count(*) FILTER (WHERE s.interrupted IS NULL"
        " OR jsonb_typeof(s.action) = 'object')"
        " AS n FROM steps s JOIN tasks t"
        " ON t.id = s.task_id AND t.attempt = s.attempt WHERE s.task_id = ANY($1)"
        " GROUP BY s.task_id",
        task_ids,
    )
    steps = {r["task_id"]: r["n"] for r in step_rows}
    events = events_by_task(url, task_ids)
    with_containers = set(
        subprocess.run(
            [
                "docker",
                "ps",
                "-a",
                "--filter",
                f"label=sandhive.instance={settings.instance_name()}",
                "--format",
                '{{.Label "sandhive.task"}}',
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    )
    for task_id in task_ids:
        task = tasks[task_id]
        assert task["status"] in TERMINAL, dict(task)
        seqs = [event["seq"] for event in events[task_id]]
        assert seqs == list(range(1, len(seqs) + 1)), f"{task_id}: seq gaps {seqs}"
        assert [e["type"] for e in events[task_id]].count("task.finished") == 1
        # Every answered step is stored, the one a cancel or timeout cut included.
        usage_steps = json.loads(task["usage"])["steps"]
        assert usage_steps == steps.get(task_id, 0), task_id
        assert task_id not in with_containers, f"{task_id} still has a sandbox"
    if redis_client is not None:
        pending = redis_client.xpending("sandhive:tasks", "workers")
        assert pending["pending"] == 0, pending


class ContainerWatch:
    """Samples this deployment's running sandboxes a few times a second, in a thread.

    Records the most containers ever seen at once per task and in total, to
    assert "never two sandboxes of one task at a time" (invariant 2).
    """

    def __init__(self, instance: str, interval_s: float = 0.25) -> None:
        self.instance = instance
        self.interval_s = interval_s
        self.max_per_task: Counter[str] = Counter()
        self.max_total = 0
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ContainerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(
                [
                    "docker",
                    "ps",
                    "--filter",
                    f"label=sandhive.instance={self.instance}",
                    "--format",
                    '{{.Label "sandhive.task"}}',
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            tasks = Counter(out.stdout.split())
            self.seen.update(tasks)
            self.max_total = max(self.max_total, sum(tasks.values()))
            for task_id, count in tasks.items():
                self.max_per_task[task_id] = max(self.max_per_task[task_id], count)
            self._stop.wait(self.interval_s)

    def assert_one_at_a_time(self) -> None:
        doubled = {task: n for task, n in self.max_per_task.items() if n > 1}
        assert doubled == {}, f"tasks with two sandboxes at once: {doubled}"
