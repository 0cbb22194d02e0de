"""What a tenant's Dockerfile may build from: the catalogue, never a registry or the network.

A tenant's image (`/v1/images/builds`) is built by a worker's Docker daemon, which would pull
any image a `FROM` or a `COPY --from` names and fetch any URL an `ADD` names. So the text is
parsed here strictly, and **the daemon is given a canonical Dockerfile written from this
parse, never the tenant's text**: one instruction per line, no parser directives, no line
continuations, every `FROM` naming a Docker reference of the catalogue or an earlier stage.
Whatever this parse and Docker's own could read differently (directives, odd whitespace,
quoted or escaped flags, a continuation swallowing a line) is refused, not interpreted.

Refused, each naming its line: a `FROM` of anything but a catalogue image the tenant may use
(by name or reference), `${BASE_IMAGE}` (the default image) or an earlier stage; any `FROM`
flag (`--platform` would make the daemon pull another variant); `COPY --from` anything but
an earlier, finished stage; `ADD` (its URL and archive forms reach outside or unpack
without bound: use `COPY`); `ONBUILD`, `VOLUME`, `ENTRYPOINT` and `HEALTHCHECK` (a volume is
host disk outside the sandbox's limits, and an entrypoint would wrap the sandbox's own
deadline process); parser directives. A pure module: the API checks, the worker builds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

BASE_ARG = "BASE_IMAGE"
ALLOWED = frozenset(
    {
        "FROM",
        "RUN",
        "COPY",
        "WORKDIR",
        "ENV",
        "ARG",
        "USER",
        "LABEL",
        "EXPOSE",
        "CMD",
        "SHELL",
        "STOPSIGNAL",
        "MAINTAINER",
    }
)
_WHY_NOT = {
    "ADD": "use COPY (ADD's URL and archive forms reach outside or unpack without bound)",
    "ONBUILD": "a trigger would run in a later build unchecked",
    "VOLUME": "a volume is host disk outside the sandbox's limits",
    "ENTRYPOINT": "an entrypoint would wrap the sandbox's own process",
    "HEALTHCHECK": "the sandbox runs no health checks",
}
_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*[A-Za-z]+[ \t]*=")
_CONTINUED = re.compile(r"\\[ \t]*$")
_SEPARATOR = re.compile(r"[ \t]+")
_FLAG = re.compile(r"^--(chown|chmod|from)=([A-Za-z0-9_.:/-]+)$")
_STAGE = re.compile(r"^[a-z][a-z0-9._-]{0,62}$")
_BASE_VARIABLE = re.compile(r"^\$(?:\{" + BASE_ARG + r"\}|" + BASE_ARG + r")$")
_ODD_SPACE = re.compile(r"[^\S \t\n]|[\x00-\x08\x0e-\x1f\x7f]")
"""Whitespace other than space, tab and newline, and control characters: Docker and this
parse may split on them differently."""


class DockerfileRefused(ValueError):
    """The Dockerfile names something outside the catalogue: the message names the line."""


@dataclass(frozen=True)
class Checked:
    """A Dockerfile that builds offline from the catalogue."""

    dockerfile: str
    """The canonical text to build: what the daemon gets, instead of the tenant's."""
    base: str
    """The catalogue image the final stage stands on (its resources apply)."""
    bases: frozenset[str]
    """Every catalogue image a stage stands on: the building worker must have them all."""


@dataclass(frozen=True)
class _Instruction:
    line: int
    """1-based number of its first physical line."""
    keyword: str
    rest: str
    """What follows the keyword, continuations joined as Docker joins them."""


def check(text: str, images: Mapping[str, str], *, default: str) -> Checked:
    """The canonical Dockerfile with its bases resolved, or DockerfileRefused.

    `images` maps each catalogue name the tenant may use to its Docker reference; `default`
    is the name `${BASE_IMAGE}` stands for."""
    by_reference = {reference: name for name, reference in images.items()}
    stages: list[tuple[str | None, str]] = []  # (stage name, catalogue image underneath)
    out: list[str] = []
    for instruction in _instructions(text):
        keyword, rest = instruction.keyword, instruction.rest
        if keyword not in ALLOWED:
            why = _WHY_NOT.get(keyword, "not an instruction this server builds")
            raise _refused(instruction, f"{keyword}: {why}")
        if keyword not in ("FROM", "COPY") and rest.startswith("--"):
            # RUN --mount=from=IMAGE would pull under BuildKit; the classic builder refuses.
            raise _refused(instruction, f"{keyword} takes no flags here")
        if keyword == "FROM":
            alias, base, reference = _from(instruction, images, by_reference, stages, default)
            if alias is not None and alias in {name for name, _ in stages}:
                raise _refused(instruction, f"stage name {alias!r} used twice")
            stages.append((alias, base))
            out.append(f"FROM {reference}" + (f" AS {alias}" if alias else ""))
            continue
        if not stages and keyword != "ARG":
            raise _refused(instruction, f"{keyword} before the first FROM")
        if keyword == "COPY":
            _copy(instruction, stages)
        out.append(f"{keyword} {rest}")
    if not stages:
        raise DockerfileRefused("no FROM: the Dockerfile must start from a catalogue image")
    return Checked(
        dockerfile="\n".join(out) + "\n",
        base=stages[-1][1],
        bases=frozenset(base for _, base in stages),
    )


def _from(
    instruction: _Instruction,
    images: Mapping[str, str],
    by_reference: Mapping[str, str],
    stages: list[tuple[str | None, str]],
    default: str,
) -> tuple[str | None, str, str]:
    """The stage's alias, the catalogue image underneath, and what its FROM names."""
    words = _SEPARATOR.split(instruction.rest.strip())
    if any(word.startswith("--") for word in words):
        raise _refused(instruction, "FROM takes no flags here (--platform would pull)")
    if len(words) == 3 and words[1].lower() == "as" and _STAGE.match(words[2].lower()):
        alias: str | None = words[2].lower()
    elif len(words) == 1 and words[0]:
        alias = None
    else:
        raise _refused(instruction, f"FROM {instruction.rest.strip()}: FROM IMAGE [AS name]")
    image = words[0]
    earlier = {name: base for name, base in stages if name is not None}
    if image.lower() in earlier:
        return alias, earlier[image.lower()], image.lower()
    if _BASE_VARIABLE.match(image) and default in images:
        return alias, default, images[default]
    if image in images:
        return alias, image, images[image]
    if image in by_reference:
        return alias, by_reference[image], image
    allowed = ", ".join(sorted({*images, *by_reference, "${" + BASE_ARG + "}"}))
    why = "not an image of this Sandhive's catalogue"
    if _BASE_VARIABLE.match(image):
        why = f"it stands for the image {default!r}, which this tenant may not use"
    elif "$" in image:
        why = "only ${BASE_IMAGE} may be a variable"
    raise _refused(
        instruction,
        f"FROM {image}: {why}; FROM must name one of: {allowed} or an earlier stage"
        " (nothing is pulled from a registry)",
    )


def _copy(instruction: _Instruction, stages: list[tuple[str | None, str]]) -> None:
    """Flags written plainly (`--chown=`, `--chmod=`, `--from=`), `--from` an earlier,
    finished stage only (the current one is not finished: Docker would pull its name)."""
    finished = stages[:-1]
    for word in _SEPARATOR.split(instruction.rest.strip()):
        if not word.startswith("-"):
            break
        flag = _FLAG.match(word)
        if flag is None:
            raise _refused(instruction, f"COPY {word}: only --chown=, --chmod= and --from=")
        if flag.group(1) != "from":
            continue
        source = flag.group(2).lower()
        names = {name for name, _ in finished if name is not None}
        if source not in names and not (source.isdigit() and int(source) < len(finished)):
            raise _refused(
                instruction,
                f"COPY --from={flag.group(2)}: only an earlier stage"
                " (an image would be pulled from a registry)",
            )


def _refused(instruction: _Instruction, message: str) -> DockerfileRefused:
    return DockerfileRefused(f"line {instruction.line}: {message}")


def _instructions(text: str) -> list[_Instruction]:
    """Logical instructions, continuations joined as Docker joins them (the escape and
    newline dropped, blank and comment lines inside skipped); DockerfileRefused for what
    Docker could read otherwise."""
    lines = text.replace("\r\n", "\n").split("\n")
    found: list[_Instruction] = []
    parts: list[str] = []
    first = 0
    for number, line in enumerate(lines, start=1):
        if _ODD_SPACE.search(line):
            raise DockerfileRefused(f"line {number}: a control character or unusual space")
        stripped = line.strip(" \t")
        if not found and not parts and _DIRECTIVE.match(line):
            raise DockerfileRefused(f"line {number}: parser directives are not supported")
        if not stripped or stripped.startswith("#"):
            continue  # also inside a continuation, as Docker skips them
        if not parts:
            first = number
        continued = _CONTINUED.search(line)
        parts.append(line[: continued.start()] if continued else line)
        if continued:
            continue
        found.append(_instruction(first, "".join(parts)))
        parts = []
    if parts:
        found.append(_instruction(first, "".join(parts)))
    return found


def _instruction(line: int, joined: str) -> _Instruction:
    keyword, _, rest = joined.strip(" \t").partition(" ")
    if "\t" in keyword:
        keyword, _, more = keyword.partition("\t")
        rest = more + " " + rest if rest else more
    if rest.rstrip(" \t").endswith("\\"):
        raise DockerfileRefused(f"line {line}: ends in a continuation with nothing after it")
    return _Instruction(line, keyword.upper(), rest.strip(" \t"))
