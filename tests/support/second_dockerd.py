"""A second Docker daemon on this machine, standing in for a second Docker host (docs/hosts.md).

Its own socket, exec root and pid file (under a fresh temporary directory), its own
bridge (`shvd2-<pid>`, made here, in 10.231.0.0/16) and its own cgroup parent; iptables
and masquerading off, so it never touches the chains the first daemon manages (the
sandboxes run with network `none`). Its data root is kept between runs in
`SANDHIVE_TEST_SECOND_DOCKERD_ROOT` (default /var/tmp/sandhive-test-dockerd) so the
sandbox image, loaded with `docker save | docker -H ... load` (about a minute for 1.6 GB),
is loaded again only when its id changed; one run at a time holds it (a file lock).
`stop` and `start` stop and restart the same daemon (a host going down and coming back);
the daemon is always stopped and the bridge removed at the end.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

ROOT = Path(os.environ.get("SANDHIVE_TEST_SECOND_DOCKERD_ROOT", "/var/tmp/sandhive-test-dockerd"))
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
FAR_DNS = "10.231.255.53"
"""The resolver this daemon writes into its containers' /etc/resolv.conf: never asked (network
`none`), but a sandbox can tell which daemon runs it."""


class SecondDockerd:
    def __init__(self, run_dir: Path, data_root: Path, bridge: str, subnet: str) -> None:
        self.run_dir, self.data_root, self.bridge, self.subnet = run_dir, data_root, bridge, subnet
        self.socket = run_dir / "docker.sock"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """What `DOCKER_HOST` names to reach it."""
        return f"unix://{self.socket}"

    def docker(self, *args: str, check: bool = True) -> str:
        """`docker -H <this daemon> ARGS`, its standard output."""
        done = subprocess.run(
            ["docker", "-H", self.url, *args], capture_output=True, text=True, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} failed: {done.stderr}")
        return done.stdout

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        config = self.run_dir / "daemon.json"
        config.write_text("{}")  # not /etc/docker/daemon.json: nothing of the first daemon's
        with (self.run_dir / "dockerd.log").open("ab") as log:
            self.process = self._spawn(config, log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.answers():
            assert self.process.poll() is None, f"dockerd exited:\n{self.log()}"
            assert time.monotonic() < deadline, f"dockerd did not start:\n{self.log()}"
            time.sleep(0.2)

    def answers(self) -> bool:
        done = subprocess.run(
            ["docker", "-H", self.url, "version"], capture_output=True, check=False
        )
        return done.returncode == 0

    def _spawn(self, config: Path, log: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                "dockerd",
                f"--config-file={config}",
                f"--host={self.url}",
                f"--data-root={self.data_root}",
                f"--exec-root={self.run_dir / 'exec'}",
                f"--pidfile={self.run_dir / 'docker.pid'}",
                f"--bridge={self.bridge}",
                "--iptables=false",
                "--ip-masq=false",
                "--cgroup-parent=/sandhive-second-dockerd",
                f"--dns={FAR_DNS}",  # sandboxes here can tell (tests); no resolver is asked
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def stop(self) -> None:
        """SIGTERM (it stops its containers first), then SIGKILL if it takes too long."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log(self) -> str:
        path = self.run_dir / "dockerd.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def ensure_image(self, image: str) -> None:
        """The image with the same id as on the first daemon (loaded only when it differs)."""
        wanted = _image_id(["docker"], image)
        if _image_id(["docker", "-H", self.url], image) == wanted:
            return
        with subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE) as save:
            load = subprocess.run(
                ["docker", "-H", self.url, "load"],
                stdin=save.stdout,
                capture_output=True,
                check=False,
            )
        assert (save.returncode, load.returncode) == (0, 0), load.stderr.decode(errors="replace")

    def remove_all_containers(self) -> None:
        found = self.docker("ps", "-aq", check=False).split()
        if found:
            self.docker("rm", "-f", "-v", *found, check=False)


def _image_id(docker: list[str], image: str) -> str | None:
    done = subprocess.run(
        [*docker, "image", "inspect", "--format", "{{.Id}}", image],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else None


@contextmanager
def second_dockerd(image: str) -> Iterator[SecondDockerd]:
    """A started second daemon holding `image`; stopped, its bridge removed, afterwards."""
    ROOT.mkdir(parents=True, exist_ok=True)
    with (ROOT / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one run at a time owns the data root
        run_dir = Path(tempfile.mkdtemp(prefix="shvd2-", dir="/tmp"))  # short: socket paths
        bridge = f"shvd2-{os.getpid() % 100000}"
        subnet = f"10.231.{os.getpid() % 250}.1/24"
        daemon = SecondDockerd(run_dir, ROOT / "data", bridge, subnet)
        _bridge("add", bridge, subnet)
        try:
            daemon.start()
            daemon.remove_all_containers()  # a previous run's, had it been killed
            daemon.ensure_image(image)
            yield daemon
        finally:
            try:
                if daemon.process is not None and daemon.process.poll() is None:
                    daemon.remove_all_containers()
            finally:
                daemon.stop()
            _bridge("del", bridge, subnet)
            shutil.rmtree(run_dir, ignore_errors=True)


def _bridge(action: str, name: str, subnet: str) -> None:
    if action == "add":
        subprocess.run(["ip", "link", "add", "name", name, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", subnet, "dev", name], check=True)
        subprocess.run(["ip", "link", "set", name, "up"], check=True)
    else:
        subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)


def labelled(daemon: SecondDockerd | None, label: str) -> list[str]:
    """Ids of the containers carrying `label` on `daemon` (None: the first daemon)."""
    docker = ["docker"] if daemon is None else ["docker", "-H", daemon.url]
    done = subprocess.run(
        [*docker, "ps", "-aq", "--filter", f"label={label}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


def volumes(daemon: SecondDockerd, label: str) -> list[str]:
    return daemon.docker("volume", "ls", "-q", "--filter", f"label={label}").split()
