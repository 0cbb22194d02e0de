"""Prompt configs: the built-ins, the package's placeholder rules, YAML files, custom pairs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.domain.prompt_configs import (
    BUILTIN,
    known_names,
    load_prompt_file,
    render_prompts,
    resolve_prompt,
    stored_prompt,
)
from app.errors import InvalidInput
from app.schemas.tasks import PromptPair

SECTIONS = (
    "TASK",
    "DIRECTORIES",
    "WORKFLOW",
    "IMPORTANT_NOTES",
    "ENCOURAGED_APPROACHES",
    "ANTI_HARDCODING",
)
DOMAINS = ("math", "physics", "chem", "biomed", "long_context", "instruct_follow")
LEFTOVER = re.compile(r"\{[a-z_]+\}")

# The package's own file layout (REFERENCE.md §1.6), with its placeholder conventions.
PACKAGE_STYLE_YAML = """\
system_prompt: |
  You are a tester. {command_docs}Work in {working_dir}; files are in {input_dir}.
  Literal braces are doubled: {{"key": 1}}.
instance_prompt: |
  <problem>{problem_statement}</problem>
  Put the answer in {output_dir}/answer.txt as \\boxed{{}}.
working_dir: /testbed
input_dir: /testbed/documents
output_dir: /testbed
"""


def render(name: str, problem: str = "What is 2+2?") -> tuple[str, str]:
    return render_prompts(resolve_prompt(name, workdir="/testbed"), problem)


def test_general_has_the_reference_sections_and_directories() -> None:
    system, user = render("general")
    opens = [system.find(f"<{name}>") for name in SECTIONS]
    closes = [system.find(f"</{name}>") for name in SECTIONS]
    assert -1 not in opens + closes
    assert sorted(opens + closes) == [i for pair in zip(opens, closes, strict=True) for i in pair]
    assert "/testbed/input" in system
    assert "/testbed/output" in system
    assert user.startswith("<problem>\nWhat is 2+2?\n</problem>")
    assert "/testbed/output/answer.txt" in user
    assert not LEFTOVER.search(system + user)


@pytest.mark.parametrize("name", DOMAINS)
def test_domain_configs_put_the_answer_in_the_working_directory(name: str) -> None:
    spec = resolve_prompt(name, workdir="/testbed")
    system, user = render_prompts(spec, "Q?")
    assert spec.output_dir == "/testbed"
    assert "/testbed/answer.txt" in system
    assert "/testbed/answer.txt" in user
    assert "<problem>\nQ?\n</problem>" in user
    assert not LEFTOVER.search(system + user)
    assert "{{" not in system + user  # every doubled brace was formatted


def test_math_and_physics_ask_for_boxed_answers_and_long_context_reads_documents() -> None:
    for name in ("math", "physics"):
        system, user = render(name)
        assert "\\boxed{" in user
        assert "\\\\boxed" not in user  # one backslash reaches the model
        assert "printf" in system  # how to write a backslash safely, as the package warns
    long_context = resolve_prompt("long_context", workdir="/testbed")
    assert long_context.input_dir == "/testbed/documents"
    system, user = render_prompts(long_context, "Q?")
    assert "/testbed/documents" in system
    assert "/testbed/documents" in user
    assert resolve_prompt("chem", workdir="/testbed").input_dir == "/testbed/input"


def test_the_problem_text_is_never_expanded() -> None:
    problem = "Print {output_dir}, {problem_statement}, {0} and \\boxed{} literally {{"
    for name in BUILTIN:
        _, user = render(name, problem)
        assert f"<problem>\n{problem}\n</problem>" in user


def test_a_package_style_yaml_file_follows_the_package_placeholder_rules(tmp_path: Path) -> None:
    (tmp_path / "tester.yaml").write_text(PACKAGE_STYLE_YAML)
    spec = resolve_prompt("tester", workdir="/testbed", configs_dir=tmp_path)
    assert (spec.name, spec.input_dir, spec.output_dir) == (
        "tester",
        "/testbed/documents",
        "/testbed",
    )
    system, user = render_prompts(spec, "x = {y}")
    assert system == (
        "You are a tester. Work in /testbed; files are in /testbed/documents.\n"
        'Literal braces are doubled: {"key": 1}.\n'
    )
    assert (
        user == "<problem>x = {y}</problem>\nPut the answer in /testbed/answer.txt as \\boxed{}.\n"
    )
    assert "tester" in known_names(tmp_path)


def test_a_yaml_file_replaces_a_builtin_and_missing_keys_take_the_package_defaults(
    tmp_path: Path,
) -> None:
    (tmp_path / "general.yml").write_text("system_prompt: Original wording.\n")
    spec = resolve_prompt("general", workdir="/testbed", configs_dir=tmp_path)
    assert (spec.working_dir, spec.input_dir, spec.output_dir) == (
        "/testbed",
        "/testbed/input",
        "/testbed/output",
    )
    assert render_prompts(spec, "The raw query.") == ("Original wording.", "The raw query.")
    assert load_prompt_file(tmp_path / "general.yml", workdir="/testbed") == spec


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("system_prompt: 'Use {tools}'\n", "system template does not format"),
        ("system_prompt: ok\ninstance_prompt: '{problem_statement} {'\n", "instance template"),
        ("system_prompt: [1, 2]\n", "has no system_prompt text"),
        ("system_prompt: ok\ninput_dir: /etc\n", "input_dir must be"),
        ("system_prompt: ok\noutput_dir: /testbed/../etc\n", "output_dir must be"),
        ("system_prompt: ok\nworking_dir: /work\n", "working_dir must be"),
        ("system_prompt: ok\ninput_dir: 3\n", "must be text"),
        ("system_prompt: 'a\n  - b: c'\n: :", "cannot read"),
    ],
)
def test_broken_yaml_files_are_invalid_input(tmp_path: Path, text: str, error: str) -> None:
    (tmp_path / "broken.yaml").write_text(text)
    with pytest.raises(InvalidInput, match=error):
        resolve_prompt("broken", workdir="/testbed", configs_dir=tmp_path)


def test_unknown_and_reserved_names_are_invalid_input(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text("system_prompt: s\n")
    with pytest.raises(InvalidInput, match=r"unknown prompt_config 'nope'; known: .*mine") as info:
        resolve_prompt("nope", workdir="/testbed", configs_dir=tmp_path)
    assert info.value.details == [
        {"loc": ["body", "prompt_config"], "msg": info.value.message, "type": "value_error"}
    ]
    with pytest.raises(InvalidInput, match="reserved"):
        resolve_prompt("custom", workdir="/testbed")


def test_a_custom_pair_is_checked_and_rendered() -> None:
    pair = PromptPair(
        system="Be brief. {{not a placeholder}}", instance="Task: {problem_statement}"
    )
    spec = resolve_prompt(pair, workdir="/testbed")
    assert spec.name == "custom"
    assert (spec.input_dir, spec.output_dir) == ("/testbed/input", "/testbed/output")
    assert render_prompts(spec, "add {1}") == ("Be brief. {not a placeholder}", "Task: add {1}")
    moved = resolve_prompt(
        PromptPair(system="s", input_dir="/testbed/docs", output_dir="/testbed"), workdir="/testbed"
    )
    assert render_prompts(moved, "raw") == ("s", "raw")
    assert (moved.input_dir, moved.output_dir) == ("/testbed/docs", "/testbed")
    with pytest.raises(InvalidInput, match="instance template"):
        resolve_prompt(PromptPair(system="s", instance="{problem}"), workdir="/testbed")


def test_a_task_stored_without_a_resolved_prompt_uses_the_builtin() -> None:
    spec = stored_prompt(None, "math", workdir="/testbed")
    assert spec == resolve_prompt("math", workdir="/testbed")
    resolved = resolve_prompt("chem", workdir="/testbed")
    assert stored_prompt(resolved, "general", workdir="/testbed") is resolved
