"""The rooms of `app/` against their map (docs/architecture.md) and the layout's budgets.

Used by tests/test_architecture.py and by `make lint` (`python -m tests.support.rooms`), which
needs no database: a module or package that appears at the root of `app/` (or a feature
folder inside a layer) without a line in the map, a line for one that is gone, more than
`ROOT_BUDGET` modules at the root, or a folder of more than `FOLDER_BUDGET` modules without a
sub-package is a problem it names.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
MAP = ROOT / "docs" / "architecture.md"
ROOT_BUDGET = 12
"""Modules at the root of `app/`, `__init__.py` and `__main__.py` included."""
FOLDER_BUDGET = 20
"""Modules in one folder that has no sub-package."""
LAYERS_WITH_ROOMS = ("services", "worker", "api")
"""Layers whose feature folders the map lists too."""


def mapped(map_path: Path = MAP) -> set[str]:
    """Every `app/...` entry of the map's ```rooms block."""
    text = map_path.read_text(encoding="utf-8")
    block = re.search(r"```rooms\n(.*?)```", text, re.S)
    if block is None:
        raise SystemExit(f"{map_path} has no ```rooms block")
    return {line.split()[0] for line in block.group(1).splitlines() if line.startswith("app/")}


def _packages(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def present(app: Path = APP) -> set[str]:
    """What the map must list: the root's modules and packages, the layers' feature folders."""
    found = {f"app/{p.name}" for p in app.glob("*.py")}
    found |= {f"app/{p.name}/" for p in _packages(app)}
    found |= {"app/web/"} if (app / "web").is_dir() else set()
    for layer in LAYERS_WITH_ROOMS:
        if (app / layer).is_dir():
            found |= {f"app/{layer}/{p.name}/" for p in _packages(app / layer)}
    return found


def problems(app: Path = APP, map_path: Path = MAP) -> list[str]:
    """Everything the map and the budgets say is wrong, one sentence each."""
    out = [
        f"{name} is in app/ but not in docs/architecture.md's map: add a line for it"
        for name in sorted(present(app) - mapped(map_path))
    ]
    out += [
        f"docs/architecture.md maps {name}, which app/ does not have: remove or rename the line"
        for name in sorted(mapped(map_path) - present(app))
    ]
    at_root = sorted(p.name for p in app.glob("*.py"))
    if len(at_root) > ROOT_BUDGET:
        out.append(
            f"app/ has {len(at_root)} modules at its root (at most {ROOT_BUDGET}): {at_root}; "
            "put the new one in the package of its layer and feature"
        )
    for folder in sorted({p.parent for p in app.rglob("*.py")}):
        modules = list(folder.glob("*.py"))
        if len(modules) > FOLDER_BUDGET and not _packages(folder):
            out.append(
                f"{folder.relative_to(app.parent)} has {len(modules)} modules and no sub-package "
                f"(at most {FOLDER_BUDGET}): group them by feature"
            )
    return out


if __name__ == "__main__":
    found = problems()
    for problem in found:
        print(problem, file=sys.stderr)
    sys.exit(1 if found else 0)
