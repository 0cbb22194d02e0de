"""The client's version is the API's: a release of one is a release of the other."""

from __future__ import annotations

import tomllib
from pathlib import Path

import sandhive_client

from app import __version__ as app_version

ROOT = Path(__file__).resolve().parents[2]


def test_the_client_version_tracks_the_api() -> None:
    server = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert sandhive_client.__version__ == server == app_version
