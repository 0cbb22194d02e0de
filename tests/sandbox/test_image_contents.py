"""What the real sandbox image (`settings.sandbox_image`, built from Dockerfile.sandbox by
`sandhive image build`, which .ci/run calls) gives the agent: the paper's toolset and /testbed.

Every check runs in a sandbox made the way a task's is (`DockerHost.create_sandbox`, the
policy's container config), so a tool missing only under the policy would show here too.
"""

from __future__ import annotations

import os

from app.config import Settings
from app.sandbox import DockerHost, DockerSandbox

SCIENTIFIC = ("numpy", "scipy", "sympy", "matplotlib")
TOOLS = ("git", "curl", "wget", "gcc", "make")


def test_the_fixture_image_is_the_configured_one(docker_image: str) -> None:
    """The tests' image is the one Sandhive runs tasks in, unless deliberately overridden."""
    configured = Settings.model_fields["sandbox_image"].default
    assert docker_image == os.environ.get("SANDHIVE_TEST_SANDBOX_IMAGE", configured)


async def test_scientific_python_imports(sandbox: DockerSandbox) -> None:
    probe = f"import {', '.join(SCIENTIFIC)}"  # import numpy, scipy, sympy, matplotlib
    done = await sandbox.exec(["python3", "-c", probe], timeout_s=120)
    assert done.exit_code == 0, done.stderr.decode(errors="replace")
    assert (done.stdout, done.stderr) == (b"", b"")


async def test_command_line_tools_are_on_the_path(sandbox: DockerSandbox) -> None:
    # One `command -v` per tool: bash's `command -v a b` answers 0 when only the last is found.
    script = f'for tool in {" ".join(TOOLS)}; do command -v "$tool" || exit 1; done'
    done = await sandbox.exec(["bash", "-c", script], timeout_s=60)
    assert done.exit_code == 0, (done.stdout, done.stderr)
    found = done.stdout.decode().split()
    assert [os.path.basename(path) for path in found] == list(TOOLS)


async def test_build_tools_compile_and_run_c(sandbox: DockerSandbox) -> None:
    """`build-essential` is whole: headers, compiler, make, and a binary that runs."""
    await sandbox.put_files(
        "/testbed/output",
        [
            ("six.c", b'#include <stdio.h>\nint main(void) { printf("%d\\n", 6 * 7); }\n'),
            ("Makefile", b"six: six.c\n\tgcc -o six six.c\n"),
        ],
    )
    script = "cd /testbed/output && make -s && ./six"
    done = await sandbox.exec(["bash", "-c", script], timeout_s=120)
    assert done.exit_code == 0, done.stderr.decode(errors="replace")
    assert done.stdout.decode().split() == ["42"]


async def test_testbed_is_the_working_layout(
    sandbox: DockerSandbox, host: DockerHost, docker_image: str
) -> None:
    image = await host.api().images.inspect(docker_image)
    assert image["Config"]["WorkingDir"] == "/testbed"
    done = await sandbox.exec(
        [
            "bash",
            "-c",
            "pwd; for d in input output; do test -d /testbed/$d && test -w /testbed/$d"
            " && echo $d; done",
        ]
    )
    assert done.exit_code == 0, done.stderr.decode(errors="replace")
    assert done.stdout.decode().split() == ["/testbed", "input", "output"]
