"""A benchmark task folder in the reference package's format, read into an experiment.

The package's `llm-in-sandbox benchmark` runs one folder of `benchmark/` (REFERENCE.md
§1.9): `config.yaml` (dataset and prompts), `reward.py` (`compute_score`), optional
`vanilla_llm_prompt.py` (`create_prompt(row)`) and optional local data. `read_folder`
reads such a folder with the package's rules and `experiment_body` turns it into the
JSON body of `POST /v1/experiments`, so `sandhive experiment run` (served or `--local`)
runs what the package would, with the package's directory fallbacks.

`reward.py` is never run here: its source becomes the experiment's `python` scorer, which
runs in a sandbox. `vanilla_llm_prompt.py` is run here, in the process of the user who
points the command at their own folder (as the package runs it): each row's vanilla prompt
is rendered once and sent in the row's `vanilla_prompt` field, which the vanilla arm
sends as its whole message (`prompt_field`). Hub datasets cannot be downloaded here.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

CONFIG = "config.yaml"
REWARD = "reward.py"
VANILLA_PROMPT = "vanilla_llm_prompt.py"
LOCAL_DATA = "data.json"
VANILLA_FIELD = "vanilla_prompt"
"""The row field carrying the rendered `create_prompt(row)` to the vanilla arm."""
# The runner's fallbacks (REFERENCE.md §1.9): a config.yaml with its prompts embedded keeps
# only system_prompt and instance_prompt, so these directories always apply to it.
WORKING_DIR, INPUT_DIR, OUTPUT_DIR = "/testbed", "/testbed/documents", "/testbed"
Mode = Literal["sandbox", "vanilla", "both"]
MODE_ALIASES = {"llm-in-sandbox": "sandbox", "llm": "vanilla"}
"""The package's own `--mode` names."""


class FolderError(ValueError):
    """The folder cannot be read as a task folder; the message says what to fix."""


@dataclass(frozen=True)
class PromptPair:
    system: str
    instance: str
    working_dir: str = WORKING_DIR
    input_dir: str = INPUT_DIR
    output_dir: str = OUTPUT_DIR

    def as_option(self) -> dict[str, str]:
        """The task's `prompt_config` (a custom pair, the package's placeholder rules)."""
        return {
            "system": self.system,
            "instance": self.instance,
            "working_dir": self.working_dir,
            "input_dir": self.input_dir,
            "output_dir": self.output_dir,
        }


@dataclass(frozen=True)
class TaskFolder:
    path: Path
    name: str
    rows: list[dict[str, Any]]
    prompts: PromptPair | None
    """The sandbox arm's prompt pair; None for a data file alone (the service's default)."""
    reward: str | None
    """The source of reward.py (None when the folder has none)."""
    create_prompt: Callable[[dict[str, Any]], Any] | None = None
    data_source: str = ""
    """Where the rows came from, to say so."""


@dataclass(frozen=True)
class RunOptions:
    """The package's run options, mapped onto arms (`experiment_body`)."""

    mode: Mode = "sandbox"
    start_id: int | None = None
    """0-based index of the first row (the package's `--start_id`)."""
    end_id: int | None = None
    """0-based index past the last row (exclusive, the package's `--end_id`)."""
    attempts: int = 1
    concurrency: int = 8
    max_steps: int | None = None
    llm_profile: str | None = None
    model: str | None = None
    vanilla_model: str | None = None
    """A different model for the vanilla arm (default: `model`)."""
    temperature: float | None = None
    scorer: dict[str, Any] | None = None
    """Instead of reward.py (e.g. `{"kind": "math"}`)."""
    name: str | None = None
    writable_rootfs: bool = False
    """Harbor tasks: the sandboxes' image files writable (`sandbox.read_only_rootfs: false`)."""
    egress: bool = False
    """Harbor tasks: outbound network (`sandbox.network: egress`), the verifier's too."""


def read_source(path: Path | None, data: Path | None, *, vanilla: bool) -> TaskFolder:
    """`sandhive experiment run`'s rows: a task folder (its `data` replaced by --data's), or
    a data file alone."""
    if path is not None:
        return read_folder(path, data=data, vanilla=vanilla)
    if data is not None:
        return read_data(data)
    raise FolderError("give a task folder, or a data file with --data FILE")


def read_data(data: Path) -> TaskFolder:
    """Rows from a JSON / JSON Lines file alone, no task folder: the service's own prompts
    for the sandbox arm, a built-in or JSON `--scorer` (there is no reward.py)."""
    rows = _checked(_load_rows(data), str(data))
    return TaskFolder(
        path=data, name=data.stem, rows=rows, prompts=None, reward=None, data_source=str(data)
    )


def read_folder(path: Path, *, data: Path | None = None, vanilla: bool = True) -> TaskFolder:
    """The folder as the package's runner reads it; FolderError naming what is missing.

    `data` replaces the config's dataset (a local JSON/JSONL file). `vanilla`: load
    `vanilla_llm_prompt.py` (only needed when a vanilla arm runs).
    """
    if not path.is_dir():
        raise FolderError(f"{path} is not a directory (a task folder holds {CONFIG})")
    config = _read_config(path)
    prompts = _prompts(path, config)
    rows, source = _rows(path, config, data)
    reward_path = path / REWARD
    reward = _read_text(reward_path) if reward_path.is_file() else None
    create_prompt = _load_create_prompt(path / VANILLA_PROMPT) if vanilla else None
    return TaskFolder(
        path=path,
        name=path.resolve().name,
        rows=rows,
        prompts=prompts,
        reward=reward,
        create_prompt=create_prompt,
        data_source=source,
    )


def experiment_body(folder: TaskFolder, options: RunOptions) -> dict[str, Any]:
    """The `POST /v1/experiments` body (ExperimentCreate) for the folder run with `options`."""
    mode = options.mode
    rows = _slice(folder.rows, options.start_id, options.end_id)
    arms: list[dict[str, Any]] = []
    if mode in ("sandbox", "both"):
        arms.append(_arm("sandbox", options, options.model, folder.prompts))
    if mode in ("vanilla", "both"):
        vanilla = _arm("vanilla", options, options.vanilla_model or options.model, None)
        if folder.create_prompt is not None:
            rows = [{**row, VANILLA_FIELD: _render(folder.create_prompt, row)} for row in rows]
            vanilla["prompt_field"] = VANILLA_FIELD
        arms.append(vanilla)
    return {
        "name": options.name or f"{folder.name} ({mode})",
        "dataset": {"rows": rows},
        "arms": arms,
        "scorer": _as_package(options.scorer) if options.scorer else _reward_scorer(folder),
        "attempts": options.attempts,
        "concurrency": options.concurrency,
        "metadata": {"package_task": folder.name},
        "rules": "package",
    }


PACKAGE_RULED = ("math", "mcq")
"""Built-in scorers with the package's own rule (`app.scoring.package`)."""


def _as_package(scorer: dict[str, Any]) -> dict[str, Any]:
    """`--scorer math` or `mcq` scores as the package's reward.py for that domain does: a
    folder run gives the package's numbers. A scorer given with options (`"package":
    false`, `choices`, a tolerance) is Sandhive's own, as written."""
    if scorer.get("kind") in PACKAGE_RULED and set(scorer) == {"kind"}:
        return {**scorer, "package": True}
    return scorer


def parse_arms(value: str) -> Mode:
    """`--arms sandbox,vanilla`: the arms by name, in any order."""
    names = {name.strip() for name in value.split(",") if name.strip()}
    if names == {"sandbox", "vanilla"}:
        return "both"
    if len(names) == 1 and names <= {"sandbox", "vanilla"}:
        return "sandbox" if "sandbox" in names else "vanilla"
    raise FolderError(f"--arms must name sandbox, vanilla or both (sandbox,vanilla), got {value!r}")


def parse_rules(value: str) -> str:
    if value not in ("package", "sandhive"):
        raise FolderError(f"--rules must be package or sandhive, got {value!r}")
    return value


def parse_mode(value: str) -> Mode:
    mode = MODE_ALIASES.get(value, value)
    if mode not in ("sandbox", "vanilla", "both"):
        raise FolderError(f"--mode must be sandbox, vanilla or both, got {value!r}")
    return mode  # type: ignore[return-value]  # checked just above


def parse_scorer(value: str) -> dict[str, Any]:
    """`--scorer`: a built-in scorer's name (`math`) or a scorer object as JSON."""
    text = value.strip()
    if not text.startswith("{"):
        return {"kind": text}
    try:
        spec = json.loads(text)
    except ValueError as exc:
        raise FolderError(f"--scorer is neither a scorer name nor JSON: {exc}") from None
    if not isinstance(spec, dict):
        raise FolderError('--scorer JSON must be an object like {"kind": "math"}')
    return spec


# config.yaml


def _read_config(path: Path) -> dict[str, Any]:
    config_path = path / CONFIG
    if not config_path.is_file():
        raise FolderError(f"{path} has no {CONFIG} (the package's task folders all have one)")
    return _read_mapping(config_path, "a mapping of keys (dataset, system_prompt...)")


def _read_mapping(path: Path, expected: str) -> dict[str, Any]:
    """A YAML file that must hold a mapping; `expected` says what the error should ask for."""
    try:
        data = yaml.safe_load(_read_text(path))
    except yaml.YAMLError as exc:
        raise FolderError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise FolderError(f"{path}: expected {expected}")
    return data


def _prompts(path: Path, config: Mapping[str, Any]) -> PromptPair:
    """The package's two prompt formats: embedded (dirs fall back) or a separate file."""
    if "system_prompt" in config:
        return PromptPair(
            system=_text(config, "system_prompt", CONFIG),
            instance=_text(config, "instance_prompt", CONFIG, default=""),
        )
    if "prompt_config" in config:
        ref = str(config["prompt_config"])
        found = _existing(path, ref)
        if found is None:
            raise FolderError(f"{CONFIG}: prompt_config {ref!r} not found (next to it or here)")
        data = _read_mapping(found, "system_prompt and instance_prompt")
        # The separate file is kept whole by the package: its directories apply.
        return PromptPair(
            system=_text(data, "system_prompt", found.name),
            instance=_text(data, "instance_prompt", found.name, default=""),
            working_dir=_text(data, "working_dir", found.name, default=WORKING_DIR),
            input_dir=_text(data, "input_dir", found.name, default=INPUT_DIR),
            output_dir=_text(data, "output_dir", found.name, default=OUTPUT_DIR),
        )
    raise FolderError(f"{path / CONFIG} has neither system_prompt nor prompt_config")


def _text(data: Mapping[str, Any], key: str, where: str, *, default: str | None = None) -> str:
    value = data.get(key)
    if value is None and default is not None:
        return default
    if not isinstance(value, str) or (default is None and not value.strip()):
        raise FolderError(f"{where}: {key} must be text")
    return value


# The dataset


def _rows(
    path: Path, config: Mapping[str, Any], data: Path | None
) -> tuple[list[dict[str, Any]], str]:
    if data is not None:
        return _checked(_load_rows(data), str(data)), str(data)
    name = config.get("dataset")
    if name == "json":
        files = _data_files(path, config.get("data_files"))
        rows = [row for file in files for row in _load_rows(file)]
        return _checked(rows, ", ".join(map(str, files))), ", ".join(map(str, files))
    local = path / LOCAL_DATA
    if local.is_file():
        return _checked(_load_rows(local), str(local)), str(local)
    if name is None:
        raise FolderError(f"{CONFIG} names no dataset and there is no {LOCAL_DATA}")
    where = f"{name!r}" + (f" (config {config['config']!r})" if config.get("config") else "")
    raise FolderError(
        f"{CONFIG} names the Hugging Face dataset {where}, which cannot be downloaded here: "
        f"put its rows in {path / LOCAL_DATA} (JSON or JSON Lines) or pass --data FILE"
    )


def _data_files(path: Path, value: object) -> list[Path]:
    """`data_files` as the `datasets` json loader takes it: one path, a list, or by split."""
    if isinstance(value, Mapping):
        value = value.get("train")  # the package loads split="train"
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise FolderError(f"{CONFIG}: dataset json needs data_files (a path or a list of paths)")
    found = []
    for name in names:
        file = _existing(path, name)
        if file is None:
            raise FolderError(
                f"{CONFIG}: data file {name!r} not found in {path} or {path.parent} "
                "(the package resolves it against its benchmark/ folder)"
            )
        found.append(file)
    return found


def _existing(path: Path, name: str) -> Path | None:
    """The folder first, then its parent (the package's `benchmark/`), then as written."""
    ref = Path(name).expanduser()
    if ref.is_absolute():
        return ref if ref.is_file() else None
    for base in (path, path.parent, Path.cwd()):
        if (base / ref).is_file():
            return base / ref
    return None


Located = tuple[str, dict[str, Any]]
"""A row and where it was read (`file:line` in JSON Lines, `file: row N` in JSON)."""


def _load_rows(file: Path) -> list[Located]:
    """JSON (a list of rows, or {"rows"|"data": [...]}) or JSON Lines."""
    if not file.is_file():
        raise FolderError(f"{file}: no such data file")
    text = _read_text(file)
    try:
        data = json.loads(text)
    except ValueError:
        return _json_lines(file, text)
    if isinstance(data, dict):  # {"rows": [...]}, or JSON Lines of one row
        data = data.get("rows", data.get("data")) if "id" not in data else [data]
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        raise FolderError(f"{file}: expected a list of row objects (or JSON Lines)")
    return [(f"{file}: row {i}", row) for i, row in enumerate(data)]


def _json_lines(file: Path, text: str) -> list[Located]:
    rows: list[Located] = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise FolderError(f"{file}:{number}: neither JSON nor JSON Lines ({exc})") from None
            if not isinstance(row, dict):
                raise FolderError(f"{file}:{number}: a row must be a JSON object")
            rows.append((f"{file}:{number}", row))
    return rows


def _checked(rows: list[Located], source: str) -> list[dict[str, Any]]:
    """Rows as the package needs them (id, problem_statement, ground_truth) and their files
    as an object; a problem names the file and the row's line (or index)."""
    if not rows:
        raise FolderError(f"{source}: the dataset has no rows")
    out = []
    for where, row in rows:
        missing = [k for k in ("id", "problem_statement", "ground_truth") if k not in row]
        if missing:
            raise FolderError(f"{where} ({row.get('id', 'no id')!r}) lacks {missing}")
        out.append(
            {**row, "input_files": _input_files(where, row)} if "input_files" in row else row
        )
    return out


def _input_files(source: str, row: Mapping[str, Any]) -> Any:
    value = row["input_files"]
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise FolderError(f"{source} ({row['id']!r}): input_files is not JSON") from None
    return value  # the service drops null contents, as the package does, or names the row


def _slice(rows: list[dict[str, Any]], start: int | None, end: int | None) -> list[dict[str, Any]]:
    """The package's `[start_id, end_id)`, 0-based; the service refuses an empty dataset."""
    if start is None and end is None:
        return rows
    chosen = rows[start or 0 : len(rows) if end is None else end]
    if not chosen:
        raise FolderError(
            f"--start-id {start} --end-id {end}: no rows (the dataset has {len(rows)})"
        )
    return chosen


# reward.py and vanilla_llm_prompt.py


def _reward_scorer(folder: TaskFolder) -> dict[str, Any]:
    if folder.reward is None and folder.path.is_file():
        raise FolderError(
            f"{folder.path}: rows without a task folder need --scorer (e.g. math, mcq, "
            """exact, or a scorer's JSON such as '{"kind": "f1"}')"""
        )
    if folder.reward is None:
        raise FolderError(
            f"{folder.path} has no {REWARD}: add one (compute_score(agent_answer, ground_truth,"
            " **row) -> float) or choose a built-in scorer with --scorer (e.g. math, mcq)"
        )
    return {"kind": "python", "code": folder.reward}


def _load_create_prompt(path: Path) -> Callable[[dict[str, Any]], Any] | None:
    """`create_prompt` of the folder's vanilla_llm_prompt.py, imported as the package does
    (by path; a file without the function means the default, the problem statement)."""
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(f"sandhive_vanilla_prompt_{id(path)}", path)
    if spec is None or spec.loader is None:
        raise FolderError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise FolderError(f"{path}: importing it failed ({type(exc).__name__}: {exc})") from None
    found = getattr(module, "create_prompt", None)
    return found if callable(found) else None


def _render(create_prompt: Callable[[dict[str, Any]], Any], row: dict[str, Any]) -> str:
    try:
        prompt = create_prompt(dict(row))
    except Exception as exc:
        raise FolderError(
            f"{VANILLA_PROMPT}: create_prompt failed on row {row.get('id')!r} "
            f"({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(prompt, str) or not prompt.strip():
        raise FolderError(f"{VANILLA_PROMPT}: create_prompt gave no text for row {row.get('id')!r}")
    return prompt


def _arm(
    name: str, options: RunOptions, model: str | None, prompts: PromptPair | None
) -> dict[str, Any]:
    llm = _given(profile=options.llm_profile, model=model, temperature=options.temperature)
    task: dict[str, Any] = {"llm": llm} if llm else {}
    if prompts is not None:  # a folder's sandbox arm; otherwise the service's default
        task["prompt_config"] = prompts.as_option()
    if name == "sandbox" and options.max_steps is not None:
        task["limits"] = {"max_steps": options.max_steps}
    return {"name": name, "mode": name, "task": task}


def _given(**values: object) -> dict[str, object]:
    return {key: value for key, value in values.items() if value is not None}


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FolderError(f"{path}: cannot be read ({type(exc).__name__}: {exc})") from None


def summary(folder: TaskFolder) -> Sequence[str]:
    """What was read, to print before submitting."""
    if folder.path.is_file():
        return [f"{len(folder.rows)} rows from {folder.data_source} (no task folder)"]
    return [
        f"task folder {folder.path}: {len(folder.rows)} rows from {folder.data_source}",
        f"reward.py: {'yes' if folder.reward is not None else 'no'}; "
        f"vanilla_llm_prompt.py: {'yes' if folder.create_prompt is not None else 'no'}",
    ]
