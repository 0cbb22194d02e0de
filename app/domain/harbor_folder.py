"""Harbor task folders read into an experiment: `sandhive experiment run FOLDER` where FOLDER
is one Harbor task (`task.toml`, `instruction.md`, `environment/Dockerfile`, `tests/`) or a
folder of them (a Harbor dataset).

Each task is one row: its instruction is the prompt, its `environment/` is built into the
tenant's images as `built/harbor-<16 hex>` (named by the packed folder's digest, so an
unchanged folder names an image already built and is not sent again, and tasks with one
environment share it), and its
`tests/` become the row's verifier, run in the item's own sandbox after the agent (Harbor's
`bash /tests/test.sh` writing /logs/verifier/reward.txt or reward.json). The experiment's
scorer is `verifier`. Harbor's `solution/` is not read: the agent under test is the model.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import shlex
import tarfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.domain.package_folder import FolderError, RunOptions

TASK_FILE = "task.toml"
INSTRUCTION = "instruction.md"
ENVIRONMENT = "environment"
TESTS = "tests"
TEST_SCRIPT = "test.sh"
IMAGE_PREFIX = "harbor-"
HASH_CHARS = 16
DEFAULT_VERIFIER_TIMEOUT_S = 600
DEFAULT_BUILD_TIMEOUT_S = 600.0
"""Harbor's own defaults (`VerifierConfig.timeout_sec`, `EnvironmentConfig.build_timeout_sec`)."""


@dataclass(frozen=True)
class HarborTask:
    """One task folder, as the experiment needs it."""

    name: str
    path: Path
    instruction: str
    dockerfile: str
    context: bytes
    """The `environment/` folder packed (gzip tar, the same bytes for the same folder)."""
    tests: dict[str, str]
    """`tests/` by path, as text."""
    verifier_timeout_s: int = DEFAULT_VERIFIER_TIMEOUT_S
    verifier_env: dict[str, str] = field(default_factory=dict)
    build_timeout_s: float = DEFAULT_BUILD_TIMEOUT_S

    @property
    def image_name(self) -> str:
        """`harbor-<16 hex of its environment>`: tasks with the same environment share one
        image, and an edited one is a new name (the tenant's `SANDHIVE_TENANT_MAX_IMAGE_BUILDS`
        counts names)."""
        return f"{IMAGE_PREFIX}{hashlib.sha256(self.context).hexdigest()[:HASH_CHARS]}"

    def verifier_command(self) -> str:
        """Harbor's `bash /tests/test.sh`, with `[verifier].env` exported first."""
        exports = "".join(
            f"export {name}={shlex.quote(value)}; " for name, value in self.verifier_env.items()
        )
        return f"{exports}bash /tests/{TEST_SCRIPT}"


def is_harbor(path: Path) -> bool:
    """Whether `path` is a Harbor task folder, or a folder of them."""
    if (path / TASK_FILE).is_file():
        return True
    return path.is_dir() and any((child / TASK_FILE).is_file() for child in path.iterdir())


def read_harbor(path: Path) -> list[HarborTask]:
    """The task at `path`, or each task folder under it (sorted by name); FolderError
    naming the file at fault."""
    if (path / TASK_FILE).is_file():
        return [read_task(path)]
    folders = sorted(child for child in path.iterdir() if (child / TASK_FILE).is_file())
    if not folders:
        raise FolderError(f"{path}: no Harbor task ({TASK_FILE}) in it or in its folders")
    return [read_task(folder) for folder in folders]


def read_task(path: Path) -> HarborTask:
    config = _toml(path / TASK_FILE)
    verifier = _table(config, "verifier", path)
    environment = _table(config, "environment", path)
    env = verifier.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise FolderError(f"{path / TASK_FILE}: [verifier].env must map names to strings")
    for name in env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise FolderError(f"{path / TASK_FILE}: [verifier].env: bad variable name {name!r}")
    dockerfile = path / ENVIRONMENT / "Dockerfile"
    if not dockerfile.is_file():
        raise FolderError(f"{path}: no {ENVIRONMENT}/Dockerfile (Sandhive builds it)")
    tests = _texts(path / TESTS, path)
    if TEST_SCRIPT not in tests:
        raise FolderError(f"{path}: no {TESTS}/{TEST_SCRIPT} (the verifier)")
    return HarborTask(
        name=path.resolve().name,
        path=path,
        instruction=_text(path / INSTRUCTION, path),
        dockerfile=_text(dockerfile, path),
        context=pack(path / ENVIRONMENT),
        tests=tests,
        verifier_timeout_s=_seconds(verifier, DEFAULT_VERIFIER_TIMEOUT_S, path),
        verifier_env=dict(env),
        build_timeout_s=float(
            _seconds(environment, DEFAULT_BUILD_TIMEOUT_S, path, key="build_timeout_sec")
        ),
    )


def harbor_body(tasks: list[HarborTask], options: RunOptions) -> dict[str, Any]:
    """The `POST /v1/experiments` body: a row per task (those chosen: the caller applies
    `start_id`/`end_id`, so only their images are built), scored by its verifier."""
    rows = [
        {
            "id": task.name,
            "problem_statement": task.instruction,
            "image": f"built/{task.image_name}",
            "verifier": {
                "files": task.tests,
                "command": task.verifier_command(),
                "timeout_s": task.verifier_timeout_s,
            },
        }
        for task in tasks
    ]
    arms = []
    for mode in ("sandbox", "vanilla"):
        if options.mode not in (mode, "both"):
            continue
        llm: dict[str, Any] = {}
        if options.llm_profile:
            llm["profile"] = options.llm_profile
        model = options.vanilla_model if mode == "vanilla" else None
        if model or options.model:
            llm["model"] = model or options.model
        if options.temperature is not None:
            llm["temperature"] = options.temperature
        task: dict[str, Any] = {"llm": llm} if llm else {}
        if mode == "sandbox" and options.max_steps is not None:
            task["limits"] = {"max_steps": options.max_steps}
        sandbox: dict[str, Any] = {}
        if options.writable_rootfs:
            sandbox["read_only_rootfs"] = False
        if options.egress:  # a vanilla arm's verifier runs in a sandbox of the task too
            sandbox["network"] = "egress"
        if sandbox:
            task["sandbox"] = sandbox
        arms.append({"name": mode, "mode": mode, "task": task})
    name = tasks[0].name if len(tasks) == 1 else tasks[0].path.resolve().parent.name
    return {
        "name": options.name or f"{name} (harbor, {options.mode})",
        "dataset": {"rows": rows},
        "arms": arms,
        "scorer": {"kind": "verifier"},
        "attempts": options.attempts,
        "concurrency": options.concurrency,
        "metadata": {"harbor_tasks": [task.name for task in tasks][:100]},
    }


def pack(directory: Path) -> bytes:
    """`directory`'s files and folders as a gzip tar made the same way each time (sorted,
    owners root, times zero): its digest names the image. Symlinks stay links."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted(directory.rglob("*")):
            info = archive.gettarinfo(str(path), arcname=path.relative_to(directory).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            if info.isfile():
                with path.open("rb") as data:
                    archive.addfile(info, data)
            elif info.isdir() or info.issym():
                archive.addfile(info)
    return gzip.compress(raw.getvalue(), mtime=0)


def _toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise FolderError(f"{path}: {exc}") from None


def _table(config: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    table = config.get(name, {})
    if not isinstance(table, dict):
        raise FolderError(f"{path / TASK_FILE}: [{name}] must be a table")
    return table


def _seconds(table: dict[str, Any], default: float, path: Path, *, key: str = "timeout_sec") -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise FolderError(f"{path / TASK_FILE}: {key} must be a positive number of seconds")
    return max(1, round(value))


def _text(path: Path, task: Path) -> str:
    _inside(path, task)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FolderError(f"{path}: {exc}") from None
    if not text.strip():
        raise FolderError(f"{path}: empty")
    return text


def _texts(directory: Path, task: Path) -> dict[str, str]:
    if not directory.is_dir():
        raise FolderError(f"{directory}: no such folder (the verifier's files)")
    files: dict[str, str] = {}
    for path in sorted(directory.rglob("*")):
        _inside(path, task)
        if path.is_file():
            try:
                files[path.relative_to(directory).as_posix()] = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise FolderError(f"{path}: the verifier's files must be UTF-8 text") from None
    return files


def _inside(path: Path, task: Path) -> None:
    """A file the task sends must be the task's: a link out of its folder (to a key, a
    credential) is refused, not followed (a dataset is someone else's folder)."""
    if not path.resolve().is_relative_to(task.resolve()):
        raise FolderError(f"{path}: a link out of the task's folder; not sent")
