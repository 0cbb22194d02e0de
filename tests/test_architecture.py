"""The map of the rooms (docs/architecture.md) and the code agree, and the layout keeps its
budgets (tests/support/rooms.py, which `make lint` runs too)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.rooms import APP, MAP, problems


def test_the_map_lists_every_room_and_the_layout_keeps_its_budgets() -> None:
    assert problems() == []


def _copy(tmp_path: Path) -> tuple[Path, Path]:
    """The real app/ tree's shape (its .py files and folders) and map, to change freely."""
    app = tmp_path / "app"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__", "web"))
    (app / "web").mkdir()
    map_path = tmp_path / "architecture.md"
    shutil.copy(MAP, map_path)
    return app, map_path


def test_a_module_the_map_does_not_list_is_named(tmp_path: Path) -> None:
    app, map_path = _copy(tmp_path)
    assert problems(app, map_path) == []
    (app / "experiment_helpers.py").write_text("")
    (app / "services" / "billing").mkdir()
    (app / "services" / "billing" / "__init__.py").write_text("")
    found = problems(app, map_path)
    assert any("app/experiment_helpers.py is in app/ but not in" in p for p in found), found
    assert any("app/services/billing/ is in app/ but not in" in p for p in found), found


def test_a_mapped_room_that_is_gone_and_the_budgets_are_named(tmp_path: Path) -> None:
    app, map_path = _copy(tmp_path)
    shutil.rmtree(app / "kit")
    for n in range(2):
        (app / f"leaf_{n}.py").write_text("")
    map_path.write_text(
        map_path.read_text()
        .replace("app/kit/ ", "app/leaf_0.py ")
        .replace("app/specs.py ", "app/specs.py x\napp/leaf_1.py ")
    )
    for n in range(21):
        (app / "bus" / f"extra_{n}.py").write_text("")
    found = problems(app, map_path)
    assert found == [
        "app/ has 13 modules at its root (at most 12): "
        + str(sorted(p.name for p in app.glob("*.py")))
        + "; put the new one in the package of its layer and feature",
        f"app/bus has {len(list((app / 'bus').glob('*.py')))} modules and no sub-package "
        "(at most 20): group them by feature",
    ], found
