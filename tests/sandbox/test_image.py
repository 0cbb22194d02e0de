"""Building sandbox images with a throwaway Dockerfile and tag (never the real image)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

import app
from app.errors import SandboxError
from app.sandbox import DockerHost
from app.sandbox.image import build_offline_base, build_sandbox_image, find_dockerfile

BASE = "sandhive-base:bookworm"


@pytest.fixture
async def throwaway_tag(host: DockerHost):
    tag = f"sandhive-test-build:{uuid.uuid4().hex[:12]}"
    try:
        yield tag
    finally:
        await host.remove_image(tag)


def test_find_dockerfile_prefers_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo_file = Path(app.__file__).resolve().parent.parent / "Dockerfile.sandbox"
    monkeypatch.chdir(tmp_path)
    assert find_dockerfile() == repo_file
    (tmp_path / "Dockerfile.sandbox").write_text("FROM scratch\n")
    assert find_dockerfile() == tmp_path / "Dockerfile.sandbox"


async def test_build_passes_base_image_and_streams_the_log(
    host: DockerHost, throwaway_tag: str, tmp_path: Path
) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "ARG BASE_IMAGE=sandhive-no-such-base:nope\nFROM ${BASE_IMAGE}\nRUN echo built-$((6*7))\n"
    )
    lines: list[str] = []
    await build_sandbox_image(
        host, tag=throwaway_tag, dockerfile=dockerfile, base_image=BASE, on_log=lines.append
    )
    assert await host.has_image(throwaway_tag)
    assert any(line.startswith("Step 1/") for line in lines)
    assert "built-42" in lines


async def test_failed_build_raises_and_tags_nothing(
    host: DockerHost, throwaway_tag: str, tmp_path: Path
) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(f"FROM {BASE}\nRUN echo about to fail && exit 3\n")
    with pytest.raises(SandboxError, match="returned a non-zero code: 3"):
        await build_sandbox_image(host, tag=throwaway_tag, dockerfile=dockerfile, base_image=None)
    assert not await host.has_image(throwaway_tag)


def image_id(tag: str) -> str:
    return subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", tag],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_offline_base_is_a_no_op_when_present(docker_image: str) -> None:
    before = image_id(BASE)
    build_offline_base(BASE)  # the real deploy/ script: finds the tag and returns at once
    assert image_id(BASE) == before


def test_offline_base_failure_carries_the_script_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "deploy" / "build-base-image.sh"
    script.parent.mkdir()
    script.write_text('echo "cannot build $1 (FORCE=$FORCE)" >&2; exit 1\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SandboxError, match=r"cannot build some:tag \(FORCE=1\)"):
        build_offline_base("some:tag", force=True)
