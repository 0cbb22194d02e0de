"""Output collection through the exec channel (app/sandbox/channel_collect.py) against a real
sandbox: no archive API call when the channel works, the archive API (same result) when
the channel's stream would grow past its bound."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import replace

import pytest

from app.sandbox.docker import DockerSandbox
from app.sandbox.files import CollectCaps, CollectedFile
from tests.sandbox.conftest import MakeSandbox
from tests.support.docker_calls import DockerCalls, docker_calls

__all__ = ["docker_calls"]
NO_TAR_IMAGE = "sandhive-test-no-tar"
CAPS = CollectCaps(max_files=10, max_file_bytes=4096, max_total_bytes=8192)
ARCHIVE = ("GET", "containers/{id}/archive")
SCRIPT = (
    "cd /testbed/output && printf answer > answer.txt && mkdir -p sub"
    " && printf z > sub/z && head -c 6000 /dev/zero > big && ln answer.txt hard"
)
EXPECTED_FILES = [CollectedFile("answer.txt", b"answer"), CollectedFile("sub/z", b"z")]
EXPECTED_SKIPPED = [("big", "too large"), ("hard", "hardlink")]


async def prepared(make_sandbox: MakeSandbox) -> DockerSandbox:
    box = await make_sandbox()
    done = await box.exec(["sh", "-c", SCRIPT])
    assert done.exit_code == 0, done.stderr
    assert box.uses_channel
    return box


async def test_collection_goes_through_the_channel(
    make_sandbox: MakeSandbox, docker_calls: DockerCalls
) -> None:
    box = await prepared(make_sandbox)
    got = await box.collect("/testbed/output", CAPS)
    assert got.files == EXPECTED_FILES
    assert sorted(got.skipped) == EXPECTED_SKIPPED
    assert docker_calls.calls[ARCHIVE] == 0
    missing = await box.collect("/testbed/nope", CAPS)
    assert (missing.files, missing.skipped) == ([], [])
    assert docker_calls.calls[ARCHIVE] == 0


async def test_a_stream_past_the_bound_falls_back_to_the_archive_api(
    make_sandbox: MakeSandbox, docker_calls: DockerCalls
) -> None:
    box = await prepared(make_sandbox)
    bounded = replace(CAPS, max_channel_bytes=4096)  # below this tar's size
    got = await box.collect("/testbed/output", bounded)
    assert got.files == EXPECTED_FILES
    assert sorted(got.skipped) == EXPECTED_SKIPPED
    assert docker_calls.calls[ARCHIVE] == 1
    assert box.uses_channel, "the cut tar was killed, the channel lives on"
    again = await box.exec(["sh", "-c", "pgrep -x tar || echo none"])
    assert again.stdout == b"none\n", "no tar left running"


@pytest.fixture(scope="module")
def image_without_tar(docker_image: str) -> Iterator[str]:
    """The sandbox image with its tar gone (as an image with busybox's, or none, would be)."""
    dockerfile = (
        f"FROM {docker_image}\nRUN rm /usr/bin/tar /bin/tar 2>/dev/null; ! command -v tar\n"
    )
    built = subprocess.run(
        ["docker", "build", "-q", "-t", NO_TAR_IMAGE, "-"],
        input=dockerfile,
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    yield NO_TAR_IMAGE
    subprocess.run(["docker", "rmi", "-f", NO_TAR_IMAGE], capture_output=True, check=False)


async def test_a_tar_that_fails_falls_back_to_the_archive_api(
    make_sandbox: MakeSandbox, docker_calls: DockerCalls, image_without_tar: str
) -> None:
    """No GNU tar in the image (none at all here): the archive API answers."""
    box = await make_sandbox(image=image_without_tar)
    done = await box.exec(["sh", "-c", SCRIPT])
    assert done.exit_code == 0, done.stderr
    got = await box.collect("/testbed/output", CAPS)
    assert got.files == EXPECTED_FILES
    assert docker_calls.calls[ARCHIVE] == 1
