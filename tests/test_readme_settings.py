"""README's Configuration table and `app.config.Settings` cannot drift apart.

Every field is a `SANDHIVE_<NAME>` row with its default, and every row names a field:
a setting added without its row, a row left behind by a removed setting, or a default
changed in one place only fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import SecretStr

from app.config import Settings

README = Path(__file__).resolve().parent.parent / "README.md"
UNITS = {"KiB": 2**10, "MiB": 2**20}
PROSE = object()
"""A default described in words or as a template (`the database's name`, `<hostname>-<pid>`):
computed at run time, so the field's own default is None."""
EMPTY = object()


def table_rows() -> dict[str, str]:
    """Variable name -> its documented default, from the Configuration section's table.

    A row may document several variables with defaults separated by ` / `
    (`SANDHIVE_DEFAULT_X` / `SANDHIVE_MAX_X` | `1` / `2`).
    """
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    documented: dict[str, str] = {}
    for line in section.splitlines():
        if not line.startswith("| `SANDHIVE_"):
            continue
        names_cell, default_cell = (cell.strip() for cell in line.strip("|").split("|")[:2])
        names = re.findall(r"`SANDHIVE_([A-Z0-9_]+)`", names_cell)
        defaults = default_cell.split(" / ") if len(names) > 1 else [default_cell]
        assert len(defaults) == len(names), f"one default per variable: {line}"
        for name, default in zip(names, defaults, strict=True):
            assert name not in documented, f"SANDHIVE_{name} has two rows"
            documented[name] = default.strip()
    return documented


def parse_default(cell: str) -> object:
    if cell == "unset":
        return None
    if cell == "empty":
        return EMPTY
    if sized := re.fullmatch(r"(\d+) (KiB|MiB)", cell):
        return int(sized.group(1)) * UNITS[sized.group(2)]
    if literal := re.fullmatch(r"`([^`]*)`", cell):
        # `<hostname>-<pid>`: a template filled in at run time, like a default in words.
        return PROSE if re.search(r"<\w+>", literal.group(1)) else literal.group(1)
    return PROSE


def matches(documented: object, actual: object) -> bool:
    if isinstance(actual, SecretStr):
        actual = actual.get_secret_value()
    if documented is None or documented is PROSE:
        return actual is None
    if documented is EMPTY:
        return actual is not None and not actual
    if isinstance(documented, int):
        return actual == documented
    assert isinstance(documented, str)
    if isinstance(actual, bool):
        return documented == str(actual).lower()
    if isinstance(actual, int | float):
        return float(documented) == actual
    return documented == str(actual)


def test_every_setting_has_a_row_and_every_row_a_setting() -> None:
    fields = {name.upper() for name in Settings.model_fields}
    documented = set(table_rows())
    assert sorted(f"SANDHIVE_{name}" for name in fields - documented) == [], "rows missing"
    assert sorted(f"SANDHIVE_{name}" for name in documented - fields) == [], "no such setting"


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_documented_default_is_the_real_one(name: str) -> None:
    cell = table_rows().get(name.upper())
    assert cell is not None, f"SANDHIVE_{name.upper()} has no row"
    actual = Settings.model_fields[name].get_default(call_default_factory=True)
    assert matches(parse_default(cell), actual), (cell, actual)


def test_main_settings_block_shows_the_real_defaults() -> None:
    """The short block after the quick start (`## Main settings`) names the issue's main
    variables with their defaults, and those defaults are the real ones."""
    text = README.read_text(encoding="utf-8")
    block = text.split("\n## Main settings\n", 1)[1].split("\n## ", 1)[0]
    shown = dict(re.findall(r"^SANDHIVE_([A-Z0-9_]+)=(\S*)", block, flags=re.MULTILINE))
    assert set(shown) == {
        "DATABASE_URL",
        "REDIS_URL",
        "SANDBOX_IMAGE",
        "WORKER_CONCURRENCY",
        "LLM_BASE_URL",
        "LLM_API_KEY",
        "LLM_MODEL",
    }
    for name, value in shown.items():
        actual = Settings.model_fields[name.lower()].get_default(call_default_factory=True)
        assert matches(value, actual), (name, value, actual)
    assert "(#configuration)" in block  # the way to the full table
