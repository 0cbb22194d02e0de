"""A task's `environment/Dockerfile`, read as the steps that rebuild it in a running sandbox.

Sandhive has no image-build API: the Harbor environment (`sandhive_client.harbor_env`)
starts a sandbox of the catalogue image the `FROM` line names and replays the rest of the
file in it. This module is the pure part: `parse` reads the file (continuations, comments,
flags, exec and shell forms), `plan` turns it into `Run`, `Copy` and `MakeDir` steps with
variables expanded as Docker expands them, and the state the image ends in (its `WORKDIR`,
`USER` and `ENV`), which the environment's commands then start from.

Supported: one `FROM` (with `ARG`s before it), `RUN` (shell form through the current
`SHELL`, default `/bin/sh -c`, or exec form), `COPY`/`ADD` of files of the build context
(`--chown`, `--chmod`; `ADD` of a local tar archive extracts it), `WORKDIR`, `ENV`, `ARG`,
`USER`, `SHELL`. Ignored (nothing to do in a running sandbox): `CMD`, `ENTRYPOINT`,
`EXPOSE`, `LABEL`, `MAINTAINER`, `VOLUME`, `STOPSIGNAL`, `HEALTHCHECK`, `ONBUILD`. Refused
with a `DockerfileError` naming the line: multi-stage builds, `COPY --from`, `ADD <url>`,
heredocs, `RUN --mount`/`--network`/`--security`, `USER user:group`.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "Build",
    "Copy",
    "Dockerfile",
    "DockerfileError",
    "Instruction",
    "MakeDir",
    "Run",
    "Step",
    "parse",
    "plan",
]

IGNORED = frozenset(
    {
        "CMD",
        "ENTRYPOINT",
        "EXPOSE",
        "LABEL",
        "MAINTAINER",
        "VOLUME",
        "STOPSIGNAL",
        "HEALTHCHECK",
        "ONBUILD",
    }
)
"""Instructions that only describe how a container of the image starts or is labelled."""
SUPPORTED = frozenset({"FROM", "RUN", "COPY", "ADD", "WORKDIR", "ENV", "ARG", "USER", "SHELL"})
DEFAULT_SHELL = ("/bin/sh", "-c")
_FLAG = re.compile(r"--([A-Za-z][A-Za-z0-9-]*)(?:=(\S*))?")
_HEREDOC = re.compile(r"<<-?\s*[\"']?[A-Za-z_][A-Za-z0-9_]*[\"']?")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://|^git@")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class DockerfileError(ValueError):
    """What of the Dockerfile cannot be replayed in a sandbox, and on which line."""


@dataclass(frozen=True)
class Instruction:
    """One instruction: its keyword (upper case), its `--flags` and the rest of its line."""

    keyword: str
    args: str
    line: int
    flags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Dockerfile:
    """The base image `FROM` names (variables expanded) and the instructions after it."""

    base: str
    instructions: tuple[Instruction, ...]


@dataclass(frozen=True)
class Run:
    """A command: `argv` in `cwd` as `user` (None: root), with `env` over the image's."""

    argv: tuple[str, ...]
    cwd: str
    user: str | None
    env: Mapping[str, str]
    line: int


@dataclass(frozen=True)
class Copy:
    """Build-context files (`sources`, relative to the context) to `dest` (absolute).

    `into_dir`: `dest` is a directory the sources go into (it ends with `/`, or there are
    several sources or a glob; the environment also takes a `dest` that exists as a
    directory in the sandbox for one, as Docker does); otherwise a single source is written
    as `dest` itself (a directory source always has its contents copied into `dest`).
    `extract`: `ADD`, whose local tar archives are unpacked into `dest`.
    """

    sources: tuple[str, ...]
    dest: str
    into_dir: bool
    chown: str | None
    chmod: str | None
    extract: bool
    line: int


@dataclass(frozen=True)
class MakeDir:
    """`WORKDIR`: the directory made (`mkdir -p`) as root."""

    path: str
    line: int


Step = Run | Copy | MakeDir


@dataclass(frozen=True)
class Build:
    """The steps, and the state the image is left in for the commands that follow."""

    steps: tuple[Step, ...]
    workdir: str
    user: str | None
    env: Mapping[str, str]
    """What `ENV` set (not the base image's own variables, which the sandbox has)."""


def parse(text: str, build_args: Mapping[str, str] | None = None) -> Dockerfile:
    """The instructions of `text`; `DockerfileError` for what a sandbox cannot replay."""
    instructions = list(_instructions(text))
    if not instructions:
        raise DockerfileError("the Dockerfile has no instructions (it needs a FROM)")
    pre_from: dict[str, str] = {}
    index = 0
    while index < len(instructions) and instructions[index].keyword == "ARG":
        for name, default in _arg_names(instructions[index]):
            value = (build_args or {}).get(name, default)
            if value is not None:
                pre_from[name] = value
        index += 1
    if index == len(instructions) or instructions[index].keyword != "FROM":
        found = instructions[min(index, len(instructions) - 1)]
        raise DockerfileError(f"line {found.line}: the first instruction must be FROM")
    first = instructions[index]
    froms = [i for i in instructions[index + 1 :] if i.keyword == "FROM"]
    if froms:
        raise DockerfileError(
            f"line {froms[0].line}: multi-stage builds are not supported (a second FROM); "
            "Sandhive replays one stage in a sandbox of a catalogue image"
        )
    words = _words(first.args, pre_from)
    if not words or (len(words) not in (1, 3)) or (len(words) == 3 and words[1].upper() != "AS"):
        raise DockerfileError(f"line {first.line}: FROM takes an image (and `AS name`)")
    if set(first.flags) - {"platform"}:
        raise DockerfileError(f"line {first.line}: FROM flags other than --platform")
    rest = tuple(instructions[index + 1 :])
    for instruction in rest:
        _check(instruction)
    return Dockerfile(base=words[0], instructions=rest)


def plan(
    dockerfile: Dockerfile,
    *,
    base_env: Mapping[str, str],
    base_workdir: str,
    build_args: Mapping[str, str] | None = None,
) -> Build:
    """The steps of `dockerfile` on an image whose variables are `base_env` and whose
    working directory is `base_workdir` (both from the running sandbox)."""
    state = _State(workdir=base_workdir, base_env=dict(base_env), build_args=build_args or {})
    steps: list[Step] = []
    for instruction in dockerfile.instructions:
        step = state.apply(instruction)
        if step is not None:
            steps.append(step)
    return Build(steps=tuple(steps), workdir=state.workdir, user=state.user, env=state.env)


@dataclass
class _State:
    workdir: str
    base_env: dict[str, str]
    build_args: Mapping[str, str]
    user: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, str] = field(default_factory=dict)
    shell: tuple[str, ...] = DEFAULT_SHELL

    def variables(self) -> dict[str, str]:
        return {**self.base_env, **self.args, **self.env}

    def apply(self, instruction: Instruction) -> Step | None:  # noqa: C901 - one case per keyword
        keyword, line = instruction.keyword, instruction.line
        if keyword in IGNORED:
            return None
        if keyword == "RUN":
            argv = _exec_form(instruction.args)
            if argv is None:
                argv = [*self.shell, instruction.args]
            if not argv:
                raise DockerfileError(f"line {line}: RUN with nothing to run")
            return Run(
                argv=tuple(argv),
                cwd=self.workdir,
                user=self.user,
                env={**self.args, **self.env},
                line=line,
            )
        if keyword in ("COPY", "ADD"):
            return self._copy(instruction)
        if keyword == "WORKDIR":
            path = _word(instruction.args, self.variables(), line)
            self.workdir = posixpath.normpath(posixpath.join(self.workdir, path))
            return MakeDir(path=self.workdir, line=line)
        if keyword == "ENV":
            self.env.update(_env_pairs(instruction, self.variables()))
            return None
        if keyword == "ARG":
            for name, default in _arg_names(instruction):
                value = self.build_args.get(name)
                if value is None and default is not None:
                    value = _word(default, self.variables(), line) if default else ""
                if value is not None:
                    self.args[name] = value
            return None
        if keyword == "USER":
            user = _word(instruction.args, self.variables(), line)
            if ":" in user:
                raise DockerfileError(
                    f"line {line}: USER {user}: a group is not supported (Sandhive runs "
                    "a command as a user, with that user's own groups)"
                )
            self.user = None if user in ("root", "0") else user
            return None
        if keyword == "SHELL":
            shell = _exec_form(instruction.args)
            if not shell:
                raise DockerfileError(
                    f'line {line}: SHELL takes a JSON list, e.g. ["/bin/bash", "-c"]'
                )
            self.shell = tuple(shell)
            return None
        raise AssertionError(keyword)  # _check let only the keywords above through

    def _copy(self, instruction: Instruction) -> Copy:
        line = instruction.line
        paths = _exec_form(instruction.args)
        if paths is None:
            paths = _words(instruction.args, self.variables())
        else:
            paths = [_word(p, self.variables(), line) for p in paths]
        if len(paths) < 2:
            raise DockerfileError(
                f"line {line}: {instruction.keyword} needs a source and a destination"
            )
        *sources, dest = paths
        for source in sources:
            if _URL.match(source):
                raise DockerfileError(
                    f"line {line}: ADD {source}: URLs are not fetched (the sandbox may have no "
                    "network); put the file in the environment directory and COPY it"
                )
            normal = posixpath.normpath(source.lstrip("/"))
            if normal == ".." or normal.startswith("../"):
                raise DockerfileError(f"line {line}: {source} is outside the build context")
        into_dir = dest.endswith("/") or len(sources) > 1 or any(_is_glob(s) for s in sources)
        absolute = posixpath.normpath(posixpath.join(self.workdir, dest))
        flags = {
            name: _word(value, self.variables(), line)
            for name, value in instruction.flags.items()
            if name != "link"  # a layer-caching hint: nothing to do in a sandbox
        }
        return Copy(
            sources=tuple(posixpath.normpath(s.lstrip("/")) for s in sources),
            dest=absolute,
            into_dir=into_dir,
            chown=flags.get("chown"),
            chmod=flags.get("chmod"),
            extract=instruction.keyword == "ADD",
            line=line,
        )


def _check(instruction: Instruction) -> None:
    keyword, line, flags = instruction.keyword, instruction.line, instruction.flags
    if keyword not in SUPPORTED and keyword not in IGNORED:
        raise DockerfileError(f"line {line}: unknown instruction {keyword}")
    if keyword in ("RUN", "COPY", "ADD") and _HEREDOC.search(instruction.args):
        raise DockerfileError(f"line {line}: heredocs (<<EOF) in {keyword} are not supported")
    if keyword == "RUN" and flags:
        raise DockerfileError(
            f"line {line}: RUN --{next(iter(flags))} is not supported (no BuildKit mounts, "
            "network or security modes in a sandbox)"
        )
    if keyword in ("COPY", "ADD"):
        if "from" in flags:
            raise DockerfileError(
                f"line {line}: {keyword} --from is not supported (one stage, no other images)"
            )
        unknown = set(flags) - {"chown", "chmod", "link"}
        if unknown:
            raise DockerfileError(f"line {line}: {keyword} --{sorted(unknown)[0]} is not supported")
    elif keyword != "RUN" and flags and keyword not in IGNORED:
        raise DockerfileError(f"line {line}: {keyword} --{next(iter(flags))} is not supported")


def _instructions(text: str) -> list[Instruction]:
    """Logical lines as Docker's parser makes them: comment lines dropped, a line ending in
    the escape character (blanks after it allowed) joined to the next one as it is (no
    separator added), empty and comment lines inside a continuation skipped."""
    lines = text.splitlines()
    escape, number = _directives(lines)
    continued = re.compile(re.escape(escape) + r"[ \t]*$")
    found: list[Instruction] = []
    while number < len(lines):
        start = number + 1
        stripped = lines[number].strip()
        number += 1
        if not stripped or stripped.startswith("#"):
            continue
        logical = lines[number - 1].lstrip()
        while (end := continued.search(logical)) is not None:
            logical = logical[: end.start()]
            while number < len(lines) and (
                not lines[number].strip() or lines[number].lstrip().startswith("#")
            ):
                number += 1
            if number == len(lines):
                break
            logical += lines[number]
            number += 1
        found.append(_instruction(logical.strip(), start))
    return found


def _directives(lines: list[str]) -> tuple[str, int]:
    """The escape character the parser directives at the top set, and the first line after."""
    escape = "\\"
    for number, raw in enumerate(lines):
        directive = re.match(r"#\s*([A-Za-z]+)\s*=\s*(\S+)\s*$", raw.strip())
        if directive is None:
            return escape, number
        if directive.group(1).lower() == "escape":
            escape = directive.group(2)
            if escape not in ("\\", "`"):
                raise DockerfileError(f"line {number + 1}: escape must be \\ or `")
    return escape, len(lines)


def _instruction(logical: str, line: int) -> Instruction:
    keyword, _, rest = logical.partition(" ")
    rest = rest.strip()
    flags: dict[str, str] = {}
    while rest.startswith("--"):
        match = _FLAG.match(rest)
        if match is None:
            break
        flags[match.group(1).lower()] = match.group(2) or ""
        rest = rest[match.end() :].lstrip()
    return Instruction(keyword=keyword.upper(), args=rest, line=line, flags=flags)


def _exec_form(args: str) -> list[str] | None:
    """`["a", "b"]` as a list, or None when `args` is the shell form."""
    if not args.startswith("["):
        return None
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return value


def _arg_names(instruction: Instruction) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for word in _words(instruction.args, {}, expand=False):
        name, sep, default = word.partition("=")
        if not _NAME.fullmatch(name):
            raise DockerfileError(f"line {instruction.line}: ARG {word}: not a variable name")
        out.append((name, default if sep else None))
    return out


def _env_pairs(instruction: Instruction, variables: Mapping[str, str]) -> dict[str, str]:
    line, args = instruction.line, instruction.args
    first = args.split(None, 1)[0] if args.strip() else ""
    if not first:
        raise DockerfileError(f"line {line}: ENV needs a name and a value")
    pairs: dict[str, str] = {}
    if "=" not in first:  # the legacy form: ENV NAME the rest of the line
        name, _, value = args.partition(" ")
        pairs[name] = _word(value.strip(), variables, line)
    else:
        for word in _words(args, variables):
            name, sep, value = word.partition("=")
            if not sep:
                raise DockerfileError(f"line {line}: ENV {word}: expected NAME=value")
            pairs[name] = value  # expanded with the values from before this ENV, as Docker does
    for name in pairs:
        if not _NAME.fullmatch(name):
            raise DockerfileError(f"line {line}: ENV {name}: not a variable name")
    return pairs


def _is_glob(source: str) -> bool:
    return any(c in source for c in "*?[")


def _word(text: str, variables: Mapping[str, str], line: int) -> str:
    words = _words(text, variables, split=False)
    if not words or not words[0]:
        raise DockerfileError(f"line {line}: expected a value")
    return words[0]


def _words(  # noqa: C901 - a small shell-word scanner
    text: str, variables: Mapping[str, str], *, split: bool = True, expand: bool = True
) -> list[str]:
    """Words as Docker reads them: quotes removed, `$VAR`/`${VAR}` (with `:-` and `:+`)
    expanded outside single quotes, split on unquoted blanks (unless not `split`)."""
    words: list[str] = []
    current: list[str] = []
    started = False
    quote: str | None = None
    i = 0
    while i < len(text):
        c = text[i]
        if quote == "'":
            if c == "'":
                quote = None
            else:
                current.append(c)
            i += 1
            continue
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if quote == '"' and nxt not in '"\\$':
                current.append(c)
            current.append(nxt)
            started = True
            i += 2
            continue
        if c in "'\"" and quote is None:
            quote = c
            started = True
            i += 1
            continue
        if c == '"' and quote == '"':
            quote = None
            i += 1
            continue
        if c == "$" and expand:
            value, i = _variable(text, i, variables)
            current.append(value)
            started = True
            continue
        if split and quote is None and c in " \t":
            if started or current:
                words.append("".join(current))
            current, started = [], False
            i += 1
            continue
        current.append(c)
        started = True
        i += 1
    if quote is not None:
        raise DockerfileError(f"unterminated quote in: {text}")
    if started or current:
        words.append("".join(current))
    return words


def _variable(text: str, i: int, variables: Mapping[str, str]) -> tuple[str, int]:
    """The value of the `$…` at `text[i]`, and where the text goes on after it."""
    if text.startswith("${", i):
        end = text.find("}", i)
        if end < 0:
            raise DockerfileError(f"missing }} in: {text}")
        body = text[i + 2 : end]
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?::([-+])(.*))?", body, re.S)
        if match is None:
            raise DockerfileError(f"cannot expand ${{{body}}}")
        name, op, word = match.groups()
        value = variables.get(name, "")
        if op == "-" and not value:
            value = (_words(word, variables, split=False) or [""])[0]
        elif op == "+":
            value = (_words(word, variables, split=False) or [""])[0] if value else ""
        return value, end + 1
    match = _NAME.match(text, i + 1)
    if match is None:
        return "$", i + 1
    return variables.get(match.group(0), ""), match.end()
