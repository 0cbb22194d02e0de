"""The llm-in-sandbox package's settings file and option values, read for `sandhive run`.

So that a user of the package can swap the command and keep their files and habits
(docs/coming-from-llm-in-sandbox.md): the file is looked up where the package looks
(REFERENCE.md §1.2), and its model names and `extra_body` strings are read as the
package reads them. Imported only by `app.cli.main`.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ENV_VAR = "LLM_IN_SANDBOX_CONFIG"
RUN_KEYS = ("llm_name", "llm_base_url", "api_key", "prompt_config")
"""The keys the package's `run` honours; the file's other keys are the benchmark's."""
OPENAI_PREFIXES = ("openai/", "hosted_vllm/")
"""litellm prefixes meaning "an OpenAI-compatible endpoint": the model name is what follows."""
OTHER_PREFIXES = ("anthropic/", "azure/")


class PackageOptionError(ValueError):
    """A package-style value Sandhive cannot take as the package would; the message says why."""


@dataclass(frozen=True)
class PackageSettings:
    path: Path | None
    """The file read, or None when there is none."""
    values: Mapping[str, str]
    """Its non-empty `run` keys, as strings."""


def settings_candidates(
    explicit: Path | None, env: Mapping[str, str], cwd: Path, home: Path
) -> list[Path]:
    """The package's lookup order; the first existing file wins."""
    found = [explicit] if explicit is not None else []
    if env.get(ENV_VAR):
        found.append(Path(env[ENV_VAR]))
    found += [cwd / "llm-in-sandbox.yaml", cwd / "llm_in_sandbox.yaml"]
    found += [home / ".llm-in-sandbox" / "config.yaml", home / ".llm-in-sandbox.yaml"]
    return found


def load_package_settings(
    explicit: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    home: Path | None = None,
) -> PackageSettings:
    """The first settings file found, or none; an explicit `--settings` must exist."""
    env = os.environ if env is None else env
    if explicit is not None and not explicit.is_file():
        raise PackageOptionError(f"settings file {explicit} does not exist")
    for path in settings_candidates(explicit, env, cwd or Path.cwd(), home or Path.home()):
        if path.is_file():
            return PackageSettings(path, _run_values(path))
    return PackageSettings(None, {})


def _run_values(path: Path) -> dict[str, str]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise PackageOptionError(f"cannot read settings file {path}: {exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise PackageOptionError(f"settings file {path} must hold a mapping of keys")
    return {key: str(loaded[key]) for key in RUN_KEYS if loaded.get(key) not in (None, "")}


def model_name(llm_name: str) -> str:
    """The name the endpoint sees for the package's `--llm_name`: litellm strips `openai/`
    (the package adds it to bare names); other providers need a Sandhive LLM profile."""
    for prefix in OPENAI_PREFIXES:
        if llm_name.startswith(prefix):
            return llm_name[len(prefix) :]
    if llm_name.startswith(OTHER_PREFIXES):
        provider = llm_name.split("/", 1)[0]
        raise PackageOptionError(
            f"--llm_name {llm_name!r}: for {provider}, configure an LLM profile of that kind "
            "(SANDHIVE_LLM_PROFILES) and pass --llm-profile and --model"
        )
    return llm_name


def parse_extra_body(text: str) -> dict[str, Any]:
    """A JSON object or a Python dict literal (what python-fire gave the package), with the
    strings "true"/"false" turned into booleans at any depth, as the package does."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError) as exc:
            raise PackageOptionError(f"--extra_body is neither JSON nor a dict: {exc}") from exc
    if not isinstance(value, dict):
        raise PackageOptionError("--extra_body must be an object, e.g. '{\"top_k\": 20}'")
    converted = _booleans(value)
    assert isinstance(converted, dict)
    return converted


def _booleans(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _booleans(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_booleans(item) for item in value]
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value
