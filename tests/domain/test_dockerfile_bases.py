"""What a tenant's Dockerfile may build from (`app.domain.dockerfile_bases`) and what its
build context may hold (`app.domain.build_context`): pure rules, checked before a build."""

from __future__ import annotations

import gzip
import io
import tarfile

import pytest

from app.domain import build_context
from app.domain.dockerfile_bases import DockerfileRefused, check

IMAGES = {"default": "sandhive-sandbox:latest", "chem": "sandhive-image-chem:latest"}


def test_the_daemon_gets_a_canonical_dockerfile_with_references_only() -> None:
    text = (
        "ARG V=1\n"
        "FROM ${BASE_IMAGE} AS Tools\n"
        "RUN make \\\n"
        "  # a comment inside a continuation, then a blank line\n"
        "\n"
        "  tools\n"
        "FROM chem\n"
        "COPY --from=tools /out /out\n"
        "COPY --from=0 --chown=1000:1000 /out /again\n"
        'CMD ["sleep", "1"]\n'
    )
    checked = check(text, IMAGES, default="default")
    assert checked.dockerfile == (
        "ARG V=1\n"
        "FROM sandhive-sandbox:latest AS tools\n"
        "RUN make   tools\n"  # joined as Docker joins a continuation
        "FROM sandhive-image-chem:latest\n"
        "COPY --from=tools /out /out\n"
        "COPY --from=0 --chown=1000:1000 /out /again\n"
        'CMD ["sleep", "1"]\n'
    )
    assert (checked.base, checked.bases) == ("chem", frozenset({"default", "chem"}))
    staged = check("FROM chem AS a\nFROM a\n", IMAGES, default="default")
    assert staged.base == "chem"  # a stage stands on what its own FROM named
    assert staged.dockerfile == "FROM sandhive-image-chem:latest AS a\nFROM a\n"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("FROM python:3.12\n", "line 1: FROM python:3.12: not an image of this Sandhive's"),
        ("FROM scratch\n", "line 1: FROM scratch: not an image"),
        ("ARG X=alpine\nFROM $X\n", "line 2: FROM $X: only ${BASE_IMAGE} may be a variable"),
        ("FROM --platform=linux/arm64 default\n", "line 1: FROM takes no flags"),
        ("FROM \\\npython\n", "line 1: FROM python: not an image"),  # a continued FROM
        ("FROM default\nCOPY --from=alpine /a /a\n", "line 2: COPY --from=alpine: only an"),
        ("FROM default\nCOPY --from=1 /a /a\n", "line 2: COPY --from=1: only an earlier"),
        ("FROM default AS me\nCOPY --from=me /a /a\n", "line 2: COPY --from=me: only an"),
        ('FROM default\nCOPY --fr"om"=evil/img /a /a\n', 'line 2: COPY --fr"om"=evil/img:'),
        ("FROM default\nCOPY \\\n\n--from=evil/img / /x\n", "line 2: COPY --from=evil/img"),
        ("FROM default\nCOPY\t--from=evil/img / /x\n", "line 2: COPY --from=evil/img"),
        ("FROM\tevil.example/img\n", "line 1: FROM evil.example/img: not an image"),
        ("FROM default\nRUN true \\\u00a0\nFROM evil\n", "line 2: a control character"),
        ("FROM default\nADD https://x.org/a /a\n", "line 2: ADD: use COPY"),
        ("FROM default\nONBUILD COPY --from=evil/img / /\n", "line 2: ONBUILD:"),
        ("FROM default\nVOLUME /data\n", "line 2: VOLUME:"),
        ('FROM default\nENTRYPOINT ["sh"]\n', "line 2: ENTRYPOINT:"),
        ("FROM default\nRUN <<EOF\necho hi\nEOF\n", "line 3: ECHO: not an instruction"),
        ("RUN true\nFROM default\n", "line 1: RUN before the first FROM"),
        ("FROM default\nRUN --mount=type=bind,from=alpine,target=/x true\n", "line 2: RUN takes"),
        ("FROM default AS a\nFROM chem AS a\n", "line 2: stage name 'a' used twice"),
        ("# just a comment\n", "no FROM"),
        ("# escape=`\nFROM default\n", "line 1: parser directives are not supported"),
        ("  # syntax=evil/frontend\nFROM default\n", "line 1: parser directives"),
        ("FROM default\nRUN echo \\\\\n", "line 2: ends in a continuation"),
    ],
)
def test_what_would_reach_a_registry_or_the_network_is_refused_naming_the_line(
    text: str, says: str
) -> None:
    with pytest.raises(DockerfileRefused) as refused:
        check(text, IMAGES, default="default")
    assert says in str(refused.value)


def test_another_tenants_image_is_outside_the_catalogue_it_may_use() -> None:
    with pytest.raises(DockerfileRefused, match="FROM chem: not an image"):
        check("FROM chem\n", {"default": IMAGES["default"]}, default="default")


def _tar(members: list[tarfile.TarInfo], gz: bool = False) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for member in members:
            tar.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
    return gzip.compress(raw.getvalue()) if gz else raw.getvalue()


def _file(name: str, size: int = 1) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def test_a_context_digest_is_of_its_files_not_of_their_compression() -> None:
    plain, cap = _tar([_file("a.txt")]), 2**20
    assert build_context.check(plain, cap) == build_context.check(gzip.compress(plain), cap)
    assert build_context.check(plain, cap) != build_context.check(_tar([_file("b.txt")]), cap)
    packed = build_context.with_dockerfile(plain, "FROM default\n")
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == [build_context.DOCKERFILE, "a.txt"]


def test_devices_fifos_and_bombs_are_not_a_context() -> None:
    device = tarfile.TarInfo("dev/sda")
    device.type = tarfile.BLKTYPE
    with pytest.raises(build_context.ContextRefused, match="dev/sda: only files"):
        build_context.check(_tar([device]), 1024)
    fifo = tarfile.TarInfo("pipe")
    fifo.type = tarfile.FIFOTYPE
    with pytest.raises(build_context.ContextRefused, match="pipe: only files"):
        build_context.check(_tar([fifo]), 1024)
    bomb = gzip.compress(b"\0" * 10_000_000)  # ~10 KB that would unpack to 10 MB
    with pytest.raises(build_context.ContextRefused, match="unpacks to more than 1024"):
        build_context.check(bomb, 1024)
    with pytest.raises(build_context.ContextRefused, match="unpacks to more than 1024"):
        build_context.check(_tar([_file("big", 4096)]), 1024)  # its members over the cap
    with pytest.raises(build_context.ContextRefused, match="not a tar archive"):
        build_context.check(b"not a tar at all" * 100, 1024)
    two = gzip.compress(_tar([_file("a.txt")])) + gzip.compress(_tar([fifo]))
    with pytest.raises(build_context.ContextRefused, match="one gzip member"):
        build_context.check(two, 2**20)  # the builder would read the second member unchecked
    for name in ("/etc/passwd", "../up", "a/../../up"):
        with pytest.raises(build_context.ContextRefused, match="outside the context"):
            build_context.check(_tar([_file(name)]), 2**20)


def test_the_same_files_packed_again_have_the_same_digest() -> None:
    one, two = _file("a.txt"), _file("a.txt")
    one.mtime, two.mtime = 1, 2_000_000_000  # packed at other times, by other owners
    two.uid, two.uname = 1000, "someone"
    cap = 2**20
    assert build_context.check(_tar([one]), cap) == build_context.check(_tar([two], gz=True), cap)
    executable = _file("a.txt")
    executable.mode = 0o755
    assert build_context.check(_tar([one]), cap) != build_context.check(_tar([executable]), cap)


def test_base_image_is_refused_to_a_tenant_that_may_not_use_the_default_image() -> None:
    with pytest.raises(DockerfileRefused, match="stands for the image 'default', which this"):
        check("FROM ${BASE_IMAGE}\n", {"chem": IMAGES["chem"]}, default="default")
    assert check("FROM ${BASE_IMAGE}\n", IMAGES, default="default").dockerfile == (
        "FROM sandhive-sandbox:latest\n"
    )


def test_a_worker_checks_every_stage_base_of_the_canonical_text_before_it_builds() -> None:
    from app.worker.sandboxes.builds import base_references

    canonical = check(
        "FROM chem AS a\nFROM a AS b\nFROM default\nCOPY --from=b /x /x\n",
        IMAGES,
        default="default",
    ).dockerfile
    assert base_references(canonical) == [IMAGES["chem"], IMAGES["default"]]
