"""The docs cannot drift from the code: docs/configuration.md is generated, links resolve.

docs/configuration.md is `python -m app.config --markdown` (`make docs`), built from the
attribute docstrings of `app.config.Settings`: a setting added without a docstring, or a
docstring or default changed without regenerating the page, fails here. The README's short
settings block shows real defaults, and every relative link of README.md and docs/ names a
file that exists and, with `#anchor`, one of its headings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import SecretStr

from app.config import Settings, settings_markdown

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
REGENERATE = ".venv/bin/python -m app.config --markdown > docs/configuration.md (or: make docs)"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
UNITS = {"KiB": 2**10, "MiB": 2**20}
EMPTY = object()


def test_configuration_page_is_the_generated_one() -> None:
    assert CONFIGURATION.exists(), f"docs/configuration.md is missing; run {REGENERATE}"
    assert CONFIGURATION.read_text(encoding="utf-8") == settings_markdown(), (
        f"docs/configuration.md is stale; run {REGENERATE}"
    )


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_every_setting_has_a_docstring(name: str) -> None:
    """The docstring under the field in app/config.py is its only documentation."""
    assert (Settings.model_fields[name].description or "").strip(), (
        f"Settings.{name} has no attribute docstring (write one under the field in "
        f"app/config.py, then run {REGENERATE})"
    )


def table_rows() -> dict[str, str]:
    """Variable name -> its documented default, from the generated table."""
    documented: dict[str, str] = {}
    for line in settings_markdown().splitlines():
        if match := re.match(r"\| `SANDHIVE_([A-Z0-9_]+)` \| (.*?) \| ", line):
            name, default = match.groups()
            assert name not in documented, f"SANDHIVE_{name} has two rows"
            documented[name] = default
    return documented


def test_every_setting_has_one_row() -> None:
    assert sorted(table_rows()) == sorted(name.upper() for name in Settings.model_fields)


def parse_default(cell: str) -> object:
    if cell == "unset":
        return None
    if cell == "empty":
        return EMPTY
    if sized := re.fullmatch(r"(\d+) (KiB|MiB)", cell):
        return int(sized.group(1)) * UNITS[sized.group(2)]
    literal = re.fullmatch(r"`([^`]*)`", cell)
    assert literal, f"not a default the table writes: {cell!r}"
    return literal.group(1)


def matches(documented: object, actual: object) -> bool:
    if isinstance(actual, SecretStr):
        actual = actual.get_secret_value()
    if documented is None:
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


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_documented_default_is_the_real_one(name: str) -> None:
    cell = table_rows()[name.upper()]
    actual = Settings.model_fields[name].get_default(call_default_factory=True)
    assert matches(parse_default(cell), actual), (cell, actual)


def test_main_settings_block_shows_the_real_defaults() -> None:
    """The short block of the README (`## Main settings`) names the main variables with
    their defaults, those defaults are the real ones, and it points to the full page."""
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
    assert "(docs/configuration.md)" in block  # the way to the full table


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lowercased, punctuation but `-` and `_` dropped, spaces to `-`."""
    found = set()
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE):
        found.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (anchor and anchor not in anchors(linked)):
            broken.append(target)
    assert broken == [], f"{page.relative_to(ROOT)}: broken links"
