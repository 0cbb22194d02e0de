"""Collecting what an agent shaped to fool the collector, from a real sandbox through Docker.

A sparse file costs nothing on the sandbox's tmpfs, and Docker announces one of 8 GiB or
more only in a PAX `size` record (0 in the classic field); names may hold any byte but
"/" and NUL.
"""

from __future__ import annotations

import io
import tarfile

from app.sandbox import CollectCaps, CollectedFile, DockerSandbox

CAPS = CollectCaps(max_files=100, max_file_bytes=1000, max_total_bytes=100_000)


def forged_archive() -> bytes:
    """A whole tar of output/evil.txt, which the sandbox does not have, and an end marker."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("output/evil.txt")
        content = b"made up by the agent"
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


async def sh(sandbox: DockerSandbox, script: str) -> None:
    result = await sandbox.exec(["sh", "-c", script])
    assert result.exit_code == 0, result.stderr


async def test_a_sparse_file_past_8_gib_is_skipped_and_never_parsed_as_headers(
    sandbox: DockerSandbox,
) -> None:
    await sandbox.put_files("/testbed/output", [("huge", forged_archive())])
    await sh(
        sandbox,
        "cd /testbed/output && echo before > a.txt && truncate -s 9G huge && echo after > zz.txt"
        " && test $(du -k huge | cut -f1) -lt 1024",  # sparse: the 9 GiB take no room
    )
    got = await sandbox.collect("/testbed/output", CAPS)
    assert got.files == [CollectedFile("a.txt", b"before\n")]
    assert got.skipped == [("huge", "too large"), ("", "archive read limit reached")]


async def test_names_with_control_characters_are_skipped_with_a_printable_name(
    sandbox: DockerSandbox,
) -> None:
    names = [b"new\nline", b"cr\r\nlf", b"tab\tname", b"esc\x1b[0m", b"del\x7f"]
    names += ["nel\u0085".encode(), b"bad\xff", b"ok.txt"]
    script = (
        "import os\n"
        f"for name in {names!r}:\n"
        "    open(b'/testbed/output/' + name, 'wb').write(b'x')\n"
        "os.mkdir(b'/testbed/output/dir\\n')\n"
        "open(b'/testbed/output/dir\\n/inside.txt', 'wb').write(b'y')\n"
    )
    made = await sandbox.exec(["python3", "-c", script])
    assert made.exit_code == 0, made.stderr
    got = await sandbox.collect("/testbed/output", CAPS)
    assert got.files == [CollectedFile("ok.txt", b"x")]
    assert sorted(got.skipped) == [
        ("bad\\xff", "unusable file name"),
        ("cr\\x0d\\x0alf", "unusable file name"),
        ("del\\x7f", "unusable file name"),
        ("dir\\x0a/inside.txt", "unusable file name"),
        ("esc\\x1b[0m", "unusable file name"),
        ("nel\\x85", "unusable file name"),
        ("new\\x0aline", "unusable file name"),
        ("tab\\x09name", "unusable file name"),
    ]
