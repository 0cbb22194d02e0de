"""`sandhive_client.harbor_dockerfile`: a task's Dockerfile read as the steps that replay it
in a sandbox (pure: no Harbor, no server)."""

from __future__ import annotations

import pytest
from sandhive_client.harbor_dockerfile import (
    Build,
    Copy,
    DockerfileError,
    MakeDir,
    Run,
    Step,
    parse,
    plan,
)

BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root"}


def steps_of(text: str, **build_args: str) -> tuple[list[Step], Build]:
    built = plan(
        parse(text, build_args), base_env=BASE_ENV, base_workdir="/testbed", build_args=build_args
    )
    return list(built.steps), built


def run_at(steps: list[Step], index: int) -> Run:
    step = steps[index]
    assert isinstance(step, Run), step
    return step


def test_from_names_the_base_and_args_before_it_expand_in_it() -> None:
    assert parse("FROM sandhive-sandbox:latest\n").base == "sandhive-sandbox:latest"
    assert parse("ARG TAG=latest\nFROM sandhive-sandbox:${TAG} AS build\n").base == (
        "sandhive-sandbox:latest"
    )
    assert parse("ARG TAG=latest\nFROM img:$TAG\n", {"TAG": "v2"}).base == "img:v2"
    assert parse("# syntax=docker/dockerfile:1\n# a comment\n\nfrom default\n").base == "default"


def test_run_shell_form_goes_through_sh_in_the_workdir_as_the_user_with_env_and_args() -> None:
    steps, built = steps_of(
        "FROM default\n"
        "ARG VERSION=1.0\n"
        "ENV APP_HOME=/srv/app GREETING=hi\n"
        "WORKDIR $APP_HOME\n"
        "RUN echo $GREETING $VERSION > v.txt\n"
        "USER nobody\n"
        'RUN ["id", "-u"]\n'
        "WORKDIR sub\n"
        "USER root\n"
        'CMD ["sleep", "infinity"]\n'
        "EXPOSE 80\n"
        "LABEL a=b\n"
        'ENTRYPOINT ["/bin/sh"]\n'
    )
    assert steps == [
        MakeDir(path="/srv/app", line=4),
        Run(
            argv=("/bin/sh", "-c", "echo $GREETING $VERSION > v.txt"),
            cwd="/srv/app",
            user=None,
            env={"VERSION": "1.0", "APP_HOME": "/srv/app", "GREETING": "hi"},
            line=5,
        ),
        Run(
            argv=("id", "-u"),
            cwd="/srv/app",
            user="nobody",
            env={"VERSION": "1.0", "APP_HOME": "/srv/app", "GREETING": "hi"},
            line=7,
        ),
        MakeDir(path="/srv/app/sub", line=8),
    ]
    assert built.workdir == "/srv/app/sub"
    assert built.user is None
    assert built.env == {"APP_HOME": "/srv/app", "GREETING": "hi"}


def test_continuations_join_lines_as_docker_does() -> None:
    steps, _ = steps_of(
        "FROM default\n"
        "RUN apt-get update && \\\n"
        "# a comment inside\n"
        "\n"
        "    apt-get install -y jq \\   \n"
        "  && echo done\n"
    )
    assert run_at(steps, 0).argv[2] == "apt-get update &&     apt-get install -y jq   && echo done"


def test_escape_directive_and_shell() -> None:
    steps, _ = steps_of(
        '# escape=`\nFROM default\nSHELL ["/bin/bash", "-o", "pipefail", "-c"]\nRUN echo a `\n  b\n'
    )
    assert run_at(steps, 0).argv == ("/bin/bash", "-o", "pipefail", "-c", "echo a   b")


def test_env_forms_quotes_and_expansion() -> None:
    _, built = steps_of(
        "FROM default\n"
        "ENV A=\"hello world\" C='$A' SAME=${A}!\n"  # SAME sees A as it was before this ENV
        "ENV B=${A}! D=${MISSING:-fallback} E=${A:+set} F=\\$A\n"
        "ENV PATH=/opt/tool/bin:$PATH\n"
        "ENV LEGACY the rest of the line\n"
    )
    assert built.env == {
        "A": "hello world",
        "C": "$A",
        "SAME": "!",
        "B": "hello world!",
        "D": "fallback",
        "E": "set",
        "F": "$A",
        "PATH": "/opt/tool/bin:/usr/local/bin:/usr/bin:/bin",
        "LEGACY": "the rest of the line",
    }


def test_arg_values_come_from_build_args_and_stay_out_of_the_image_env() -> None:
    steps, built = steps_of("FROM default\nARG MODE\nARG LEVEL=3\nRUN make\n", MODE="fast")
    assert run_at(steps, 0).env == {"MODE": "fast", "LEVEL": "3"}
    assert built.env == {}


def test_copy_and_add_resolve_destinations_against_the_workdir() -> None:
    steps, _ = steps_of(
        "FROM default\n"
        "WORKDIR /app\n"
        "COPY requirements.txt .\n"
        "COPY --chown=nobody --chmod=755 run.sh /usr/local/bin/run\n"
        "COPY src/ lib/\n"
        'COPY ["a b.txt", "c.txt", "data/"]\n'
        "COPY *.py ./py\n"
        "ADD --link vendor.tar.gz /opt/vendor\n"
    )
    copies = [s for s in steps if isinstance(s, Copy)]
    assert [(c.sources, c.dest, c.into_dir, c.chown, c.chmod, c.extract) for c in copies] == [
        (("requirements.txt",), "/app", False, None, None, False),
        (("run.sh",), "/usr/local/bin/run", False, "nobody", "755", False),
        (("src",), "/app/lib", True, None, None, False),
        (("a b.txt", "c.txt"), "/app/data", True, None, None, False),
        (("*.py",), "/app/py", True, None, None, False),
        (("vendor.tar.gz",), "/opt/vendor", False, None, None, True),
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "no instructions"),
        ("RUN true\n", "first instruction must be FROM"),
        ("FROM a AS build\nRUN make\nFROM b\nCOPY --from=build /x /x\n", "multi-stage"),
        ("FROM a\nCOPY --from=other:1 /x /x\n", "COPY --from"),
        ("FROM a\nADD https://example.com/x.tgz /x\n", "URLs are not fetched"),
        ("FROM a\nADD git@github.com:o/r.git /r\n", "URLs are not fetched"),
        ("FROM a\nRUN --mount=type=cache,target=/root/.cache pip install x\n", "RUN --mount"),
        ("FROM a\nRUN <<EOF\necho hi\nEOF\n", "heredocs"),
        ("FROM a\nUSER app:app\n", "a group is not supported"),
        ("FROM a\nCOPY ../secret /x\n", "outside the build context"),
        ("FROM a\nCOPY onlyone\n", "a source and a destination"),
        ("FROM a\nFROBNICATE x\n", "unknown instruction FROBNICATE"),
        ("FROM a\nSHELL /bin/bash -c\n", "SHELL takes a JSON list"),
        ('FROM a\nENV A="open\n', "unterminated quote"),
    ],
)
def test_what_a_sandbox_cannot_replay_is_refused_naming_the_line(text: str, says: str) -> None:
    with pytest.raises(DockerfileError, match=says):
        plan(parse(text), base_env=BASE_ENV, base_workdir="/testbed")
