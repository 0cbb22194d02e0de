"""The names the Harbor environment gives its server builds (`sandhive_client.harbor_build`):
the task's name and a hash of its environment folder's content, always a valid build name."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from sandhive_client.harbor_build import folder_hash, image_name

BUILD_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")  # app/schemas/images.py


def environment(directory: Path) -> Path:
    directory.mkdir()
    (directory / "Dockerfile").write_text("FROM default\nCOPY . /opt/\n")
    (directory / "run.sh").write_text("#!/bin/sh\n")
    (directory / "link").symlink_to("run.sh")
    return directory


@pytest.mark.parametrize(
    ("task", "slug"),
    [
        ("hello-world", "hello-world"),
        ("Fix The_Bug v2.1", "fix-the_bug-v2.1"),
        ("--Ünïcode--", "n-code"),
        ("___", "task"),
        ("a" * 200, "a" * 44),
    ],
)
def test_the_name_is_the_task_slug_and_12_hex_within_the_build_name_pattern(
    tmp_path: Path, task: str, slug: str
) -> None:
    folder = environment(tmp_path / "environment")
    name = image_name(task, folder)
    assert name == f"harbor-{slug}-{folder_hash(folder)[:12]}"
    assert BUILD_NAME.match(name), name


def test_the_hash_follows_the_content_and_not_the_times(tmp_path: Path) -> None:
    folder = environment(tmp_path / "environment")
    before = folder_hash(folder)
    os.utime(folder / "run.sh", (0, 0))
    assert folder_hash(folder) == before  # a fresh checkout names the same image

    changes = []
    (folder / "run.sh").chmod(0o755)
    changes.append(folder_hash(folder))
    (folder / "link").unlink()
    (folder / "link").symlink_to("Dockerfile")
    changes.append(folder_hash(folder))
    (folder / "sub").mkdir()
    changes.append(folder_hash(folder))
    (folder / "Dockerfile").write_text("FROM default\n")
    changes.append(folder_hash(folder))
    assert len({before, *changes}) == 5  # each change, a new name
