"""What a tenant's Dockerfile may build FROM: the catalogue, never a registry.

A tenant's image (`/v1/images/builds`) is built by a worker's Docker daemon, which would pull
any image a `FROM` or a `COPY --from` names and fetch any URL an `ADD` names. Both are
refused here, before anything is stored: every stage starts from a catalogue image the tenant
may use (named by its catalogue name or its Docker reference, or `${BASE_IMAGE}`, the default
image) or from an earlier stage. A catalogue name is rewritten to its reference, which is
what the daemon knows. So the build is offline, and its result has what a sandbox needs (the
toolset and the exec channel come from the catalogue image underneath).

Docker's own parsing is followed where it matters here: parser directives (`# escape=`),
line continuations, comment lines inside them, flags, the JSON form of `COPY`/`ADD`, and
stage names compared without case. A pure module: the API checks, the worker builds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

BASE_ARG = "BASE_IMAGE"
_DIRECTIVE = re.compile(r"^#\s*([A-Za-z]+)\s*=\s*(\S+)\s*$")
_FLAG = re.compile(r"^--([A-Za-z][A-Za-z0-9-]*)(?:=(.*))?$")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://|^git@")
_BASE_VARIABLE = re.compile(r"^\$(?:\{" + BASE_ARG + r"\}|" + BASE_ARG + r")$")


class DockerfileRefused(ValueError):
    """The Dockerfile names something outside the catalogue: the message names the line."""


@dataclass(frozen=True)
class Checked:
    """A Dockerfile that builds offline from the catalogue."""

    dockerfile: str
    """The text to build: each `FROM` of a catalogue name rewritten to its reference."""
    base: str
    """The catalogue image the final stage stands on (its resources apply)."""
    uses_base_arg: bool
    """Whether a `FROM` reads `${BASE_IMAGE}` (the default image, passed as an argument)."""


@dataclass(frozen=True)
class _Instruction:
    line: int
    """1-based number of its first physical line."""
    keyword: str
    words: list[str]
    raw: str


def check(text: str, images: Mapping[str, str], *, default: str) -> Checked:
    """The Dockerfile with its bases resolved, or DockerfileRefused.

    `images` maps each catalogue name the tenant may use to its Docker reference; `default`
    is the name `${BASE_IMAGE}` stands for."""
    by_reference = {reference: name for name, reference in images.items()}
    lines = text.splitlines()
    stages: list[tuple[str | None, str]] = []  # (stage name, catalogue image underneath)
    rewrites: dict[int, tuple[str, str]] = {}
    from_images: list[str] = []
    for instruction in _instructions(lines):
        if instruction.keyword == "FROM":
            from_images.extend(w for w in instruction.words if not w.startswith("--"))
            alias, base, rewrite = _from(instruction, images, by_reference, stages, default)
            if rewrite is not None:
                rewrites[instruction.line] = rewrite
            stages.append((alias, base))
        elif instruction.keyword in ("COPY", "ADD"):
            _copy(instruction, stages)
        elif not stages and instruction.keyword != "ARG":
            raise DockerfileRefused(
                f"line {instruction.line}: {instruction.keyword} before the first FROM"
            )
    if not stages:
        raise DockerfileRefused("no FROM: the Dockerfile must start from a catalogue image")
    for number, (old, new) in rewrites.items():
        token = re.compile(r"^(\s*\S+\s+(?:--\S+\s+)*)" + re.escape(old) + r"(?=\s|$)")
        lines[number - 1] = token.sub(rf"\g<1>{_literal(new)}", lines[number - 1], count=1)
    uses_base_arg = any(_BASE_VARIABLE.match(word) for word in from_images)
    return Checked("\n".join(lines) + "\n", stages[-1][1], uses_base_arg)


def _literal(text: str) -> str:
    """`text` as a replacement string of `re.sub` (no group references)."""
    return text.replace("\\", "\\\\")


def _from(
    instruction: _Instruction,
    images: Mapping[str, str],
    by_reference: Mapping[str, str],
    stages: list[tuple[str | None, str]],
    default: str,
) -> tuple[str | None, str, tuple[str, str] | None]:
    """The stage's alias, the catalogue image underneath, and the rewrite of its line."""
    words = [word for word in instruction.words if not word.startswith("--")]
    if not words:
        raise DockerfileRefused(f"line {instruction.line}: FROM names no image")
    alias = words[2].lower() if len(words) >= 3 and words[1].lower() == "as" else None
    image = words[0]
    earlier = {name: base for name, base in stages if name is not None}
    if image.lower() in earlier:
        return alias, earlier[image.lower()], None
    if _BASE_VARIABLE.match(image) and default in images:
        return alias, default, None
    if image in images:
        return alias, image, (image, images[image])
    if image in by_reference:
        return alias, by_reference[image], None
    allowed = ", ".join(sorted({*images, *by_reference, "${" + BASE_ARG + "}"}))
    why = "not an image of this Sandhive's catalogue"
    if _BASE_VARIABLE.match(image):
        why = f"it stands for the image {default!r}, which this tenant may not use"
    elif "$" in image:
        why = "only ${BASE_IMAGE} may be a variable"
    raise DockerfileRefused(
        f"line {instruction.line}: FROM {image}: {why}; FROM must name one of: {allowed}"
        " or an earlier stage (nothing is pulled from a registry)"
    )


def _copy(instruction: _Instruction, stages: list[tuple[str | None, str]]) -> None:
    """`--from` an earlier stage only; `ADD` of local files only."""
    words = list(instruction.words)
    while words and (flag := _FLAG.match(words[0])):
        words.pop(0)
        if flag.group(1).lower() != "from":
            continue
        source = (flag.group(2) or "").lower()
        names = {name for name, _ in stages if name is not None}
        if source not in names and not (source.isdigit() and int(source) < len(stages)):
            raise DockerfileRefused(
                f"line {instruction.line}: {instruction.keyword} --from={flag.group(2)}: only"
                " an earlier stage (an image would be pulled from a registry)"
            )
    if instruction.keyword != "ADD":
        return
    rest = " ".join(words).strip()
    sources: list[str]
    if rest.startswith("["):
        try:
            parsed = json.loads(rest)
        except ValueError:
            parsed = None
        sources = [str(item) for item in parsed[:-1]] if isinstance(parsed, list) else []
    else:
        sources = words[:-1]
    for source in sources:
        if _URL.match(source):
            raise DockerfileRefused(
                f"line {instruction.line}: ADD {source}: only files of the build context"
                " (the build has no network)"
            )


def _directives(lines: list[str]) -> tuple[int, str]:
    """Where the instructions start, and the escape character the directives set."""
    escape = "\\"
    start = 0
    while start < len(lines):
        directive = _DIRECTIVE.match(lines[start])
        if directive is None:
            break
        if directive.group(1).lower() == "escape":
            if directive.group(2) not in ("\\", "`"):
                raise DockerfileRefused(f"line {start + 1}: escape must be \\ or `")
            escape = directive.group(2)
        start += 1
    return start, escape


def _instructions(lines: list[str]) -> list[_Instruction]:
    """Logical instructions, as Docker joins them: directives first, comments dropped,
    lines ending in the escape character continued."""
    start, escape = _directives(lines)
    found: list[_Instruction] = []
    parts: list[str] = []
    first = 0
    for index in range(start, len(lines)):
        stripped = lines[index].strip()
        if not parts and (not stripped or stripped.startswith("#")):
            continue
        if parts and stripped.startswith("#"):
            continue  # a comment inside a continuation is dropped
        if not parts:
            first = index + 1
        body = lines[index].rstrip()
        if body.endswith(escape):
            parts.append(body[: -len(escape)])
            continue
        parts.append(body)
        raw = " ".join(part.strip() for part in parts if part.strip())
        parts = []
        keyword, _, rest = raw.partition(" ")
        found.append(_Instruction(first, keyword.upper(), rest.split(), raw))
    if parts:
        raw = " ".join(part.strip() for part in parts if part.strip())
        keyword, _, rest = raw.partition(" ")
        found.append(_Instruction(first, keyword.upper(), rest.split(), raw))
    return found
