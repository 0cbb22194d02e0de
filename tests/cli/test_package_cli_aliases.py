"""`sandhive run` under the llm-in-sandbox package's option names and settings file.

Each package option must resolve to exactly what Sandhive's own option resolves to
(`--dry-run` prints the resolved task; nothing runs); the settings file is looked up
in the package's order; `--save-exchanges` (the package's `--save_litellm_response`)
leaves each model request and response next to trajectory.json — checked against what
the scripted model server itself received, in a real run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.cli.main import cli
from app.domain.package_settings import load_package_settings, parse_extra_body
from app.scripted import Script, ScriptedLLMServer, Turn

BASE = ["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--prompt", "p"]
"""A run every case starts from (nothing is called: `--dry-run`)."""

PAIRS: list[tuple[list[str], list[str]]] = [
    (["--prompt", "the task"], ["--query", "the task"]),
    (["--model", "qwen3"], ["--llm_name", "qwen3"]),
    (["--model", "qwen3"], ["--llm_name", "openai/qwen3"]),
    (["--model", "qwen3"], ["--llm_name", "hosted_vllm/qwen3"]),
    (["--base-url", "http://10.0.0.1:8000/v1"], ["--llm_base_url", "http://10.0.0.1:8000/v1"]),
    (["--api-key", "sk-one"], ["--api_key", "sk-one"]),
    (["--image", "my/image:2"], ["--docker_image", "my/image:2"]),
    (["--max-context-tokens", "5000"], ["--max_token_limit", "5000"]),
    (["--max-steps", "7"], ["--max_steps", "7"]),
    (["--max-tokens-per-call", "512"], ["--max_tokens_per_call", "512"]),
    (
        ["--extra-body", '{"top_k": 20, "chat_template_kwargs": {"thinking": true}}'],
        ["--extra_body", "{'top_k': 20, 'chat_template_kwargs': {'thinking': 'true'}}"],
    ),
    (["--prompt-config", "math"], ["--prompt_config", "math"]),
    (["--output-dir", "elsewhere"], ["--output_dir", "elsewhere"]),
    (["--save-exchanges"], ["--save_litellm_response"]),
]


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No settings file of the developer's: a fresh working directory and home."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LLM_IN_SANDBOX_CONFIG", raising=False)
    for key in [k for k in os.environ if k.startswith("SANDHIVE_LLM")]:
        monkeypatch.delenv(key)
    (tmp_path / "home").mkdir()
    return tmp_path


def resolved(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["run", *args, "--dry-run"])
    assert result.exit_code == 0, result.output
    start = result.stdout.index("{")
    return dict(json.loads(result.stdout[start:]))


@pytest.mark.parametrize(("ours", "theirs"), PAIRS, ids=[p[1][0] for p in PAIRS])
def test_each_package_option_resolves_like_ours(
    isolated: Path, ours: list[str], theirs: list[str]
) -> None:
    baseline = resolved(*BASE)
    with_ours = resolved(*BASE, *ours)
    assert with_ours != baseline, "the option changes nothing: the case proves nothing"
    base = [arg for arg in BASE]
    if ours[0] in base:  # the package name must stand in for ours, not ride along with it
        at = base.index(ours[0])
        del base[at : at + 2]
    assert resolved(*base, *theirs) == with_ours


def test_input_dir_alias_reads_the_same_files(isolated: Path) -> None:
    folder = isolated / "in"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "data.txt").write_text("x")
    ours = resolved(*BASE, "--input-dir", str(folder))
    assert ours["inputs"] == ["sub/data.txt"]
    assert resolved(*BASE, "--input_dir", str(folder)) == ours


def test_both_names_with_different_values_are_refused(isolated: Path) -> None:
    result = CliRunner().invoke(cli, ["run", *BASE, "--llm_name", "other", "--dry-run"])
    assert result.exit_code == 2
    assert "--model and --llm_name are one option" in result.output


def test_other_litellm_providers_are_refused_with_what_to_do(isolated: Path) -> None:
    args = ["run", "--base-url", "http://h/v1", "--query", "p", "--llm_name", "anthropic/claude"]
    result = CliRunner().invoke(cli, [*args, "--dry-run"])
    assert result.exit_code == 2
    assert "--llm-profile" in result.output


def test_extra_body_reads_json_and_python_literals_like_the_package() -> None:
    assert parse_extra_body('{"a": "false", "b": ["true", 1]}') == {"a": False, "b": [True, 1]}
    assert parse_extra_body("{'k': {'thinking': True}}") == {"k": {"thinking": True}}
    with pytest.raises(ValueError, match="must be an object"):
        parse_extra_body("[1]")


def write_settings(path: Path, model: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"llm_name: {model}\nllm_base_url: http://{model}:8000/v1\nother: x\n")
    return path


def test_settings_file_lookup_follows_the_package_order(tmp_path: Path) -> None:
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    places = [
        write_settings(home / ".llm-in-sandbox.yaml", "m6"),
        write_settings(home / ".llm-in-sandbox" / "config.yaml", "m5"),
        write_settings(cwd / "llm_in_sandbox.yaml", "m4"),
        write_settings(cwd / "llm-in-sandbox.yaml", "m3"),
        write_settings(tmp_path / "env.yaml", "m2"),
        write_settings(tmp_path / "explicit.yaml", "m1"),
    ]
    env = {"LLM_IN_SANDBOX_CONFIG": str(places[4])}
    # Remove the winner each time: the next one in the package's order takes over.
    for expected in range(1, 7):
        explicit = places[5] if expected == 1 else None
        found = load_package_settings(explicit, env if expected <= 2 else {}, cwd, home)
        assert found.values == {
            "llm_name": f"m{expected}",
            "llm_base_url": f"http://m{expected}:8000/v1",
        }
        places[6 - expected].unlink()
    assert load_package_settings(None, {}, cwd, home).path is None


def test_the_settings_file_fills_in_what_the_command_line_leaves_out(isolated: Path) -> None:
    (isolated / "llm-in-sandbox.yaml").write_text(
        "llm_name: openai/from-file\nllm_base_url: http://file:8000/v1\n"
        "api_key: sk-file\nprompt_config: math\n"
    )
    from_file = resolved("--query", "p")
    assert from_file["spec"]["llm"]["model"] == "from-file"
    assert from_file["base_url"] == "http://file:8000/v1"
    assert from_file["spec"]["prompt_config"] == "math"
    same = resolved(
        "--query", "p", "--model", "from-file", "--base-url", "http://file:8000/v1",
        "--api-key", "sk-file", "--prompt-config", "math",
    )  # fmt: skip
    assert from_file == same
    cli_wins = resolved("--query", "p", "--llm_name", "mine", "--prompt-config", "general")
    assert cli_wins["spec"]["llm"]["model"] == "mine"
    assert cli_wins["spec"]["prompt_config"] == "general"
    missing = CliRunner().invoke(cli, ["run", "--query", "p", "--settings", "nope.yaml"])
    assert missing.exit_code == 2
    assert "does not exist" in missing.output


def test_save_exchanges_writes_each_request_and_response_as_exchanged(
    tmp_path: Path, scripted_llm: ScriptedLLMServer, docker_image: str
) -> None:
    name = f"exchanges-{tmp_path.name}"
    scripted_llm.add_script(
        name,
        Script([Turn(tool="execute_bash", arguments={"command": "echo hi"}), Turn(tool="submit")]),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHIVE_")}
    env |= {"HOME": str(tmp_path), "SANDHIVE_SANDBOX_IMAGE": docker_image}
    env |= {"NO_PROXY": "127.0.0.1,localhost"}
    args = ["--query", "say hi", "--llm_name", f"openai/{name}", "--api_key", "sk-secret"]
    args += ["--llm_base_url", scripted_llm.base_url, "--output_dir", str(tmp_path / "out")]
    done = subprocess.run(
        [sys.executable, "-m", "app", "run", *args, "--save_litellm_response"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (folder,) = (tmp_path / "out").iterdir()
    names = sorted(path.name for path in folder.iterdir())
    assert names == [
        "files",
        "request_001.json",
        "request_002.json",
        "response_001.json",
        "response_002.json",
        "trajectory.json",
    ]
    assert scripted_llm.requests[name] == 2
    last = json.loads((folder / "request_002.json").read_text())
    assert last["body"] == scripted_llm.last_request(name)
    assert last["url"] == scripted_llm.base_url + "/chat/completions"
    first = json.loads((folder / "request_001.json").read_text())
    assert first["body"]["messages"] == last["body"]["messages"][:2]
    assert first["headers"]["authorization"] == "***"
    saved = (folder / "request_001.json").read_text() + (folder / "response_001.json").read_text()
    assert "sk-secret" not in saved
    answer = json.loads((folder / "response_001.json").read_text())
    assert answer["status"] == 200
    text = json.dumps(answer.get("body")) if "body" in answer else answer["text"]
    assert "execute_bash" in text  # the raw stream, when streamed: arguments come in pieces
    trajectory = json.loads((folder / "trajectory.json").read_text())
    assert trajectory["steps"][0]["action"]["parameters"] == {"command": "echo hi"}
