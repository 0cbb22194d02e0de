"""The "general" prompt config: its sections, placeholders and the problem text."""

from __future__ import annotations

import re

import pytest

from app.agent.prompts import PROMPT_CONFIGS, render_prompts
from app.errors import InvalidInput

SECTIONS = (
    "TASK",
    "DIRECTORIES",
    "WORKFLOW",
    "IMPORTANT_NOTES",
    "ENCOURAGED_APPROACHES",
    "ANTI_HARDCODING",
)


def test_general_has_the_reference_sections_and_no_placeholders_left() -> None:
    system, user = render_prompts("general", "What is 2+2?")
    opens = [system.find(f"<{name}>") for name in SECTIONS]
    closes = [system.find(f"</{name}>") for name in SECTIONS]
    assert -1 not in opens + closes
    assert sorted(opens + closes) == [i for pair in zip(opens, closes, strict=True) for i in pair]
    assert "/testbed/input" in system
    assert "/testbed/output" in system
    assert user.startswith("<problem>\nWhat is 2+2?\n</problem>")
    assert "/testbed/output/answer.txt" in user
    for name in ("/testbed", "/testbed/input", "/testbed/output"):
        assert name in user
    assert not re.search(r"\{[a-z_]+\}", system + user)


def test_directories_are_substituted_and_the_problem_is_kept_verbatim() -> None:
    problem = "Print {output_dir} and {x} and \\boxed{} literally"
    system, user = render_prompts(
        "general", problem, workdir="/w", input_dir="/w/docs", output_dir="/w"
    )
    assert f"<problem>\n{problem}\n</problem>" in user
    assert "/w/answer.txt" in user
    assert "/w/docs" in system
    assert "/testbed" not in system
    assert "/testbed" not in user.replace(problem, "")


def test_unknown_prompt_config_is_invalid_input() -> None:
    assert set(PROMPT_CONFIGS) == {"general"}
    with pytest.raises(InvalidInput, match="unknown prompt_config 'math'"):
        render_prompts("math", "x")
