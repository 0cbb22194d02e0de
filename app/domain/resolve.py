"""A submission checked and resolved against the server's settings: defaults, maxima, inputs.

Pure (no I/O), so the API and `sandhive run` resolve the same options into the same
`TaskSpec` with the same errors. Every violation is reported at once, shaped like a
request-validation error entry (loc, msg, type), so a 422 lists them all.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from pydantic import ValidationError

from app.config import SCRIPTED_PROFILE, LLMProfile, Settings
from app.domain.image_catalogue import DEFAULT as DEFAULT_IMAGE
from app.domain.image_catalogue import Image, allowed, catalogue
from app.domain.prompt_configs import (
    CUSTOM,
    DEFAULT,
    is_sandbox_builtin,
    resolve_prompt,
    vanilla_prompt,
)
from app.egress.rules import normalize_pattern, outside_ceiling
from app.errors import InvalidInput, TooLarge
from app.schemas.tasks import (
    InputFile,
    Limits,
    LLMOptions,
    PromptPair,
    SandboxRequest,
    TaskCreate,
    ToolsOptions,
    Verifier,
)
from app.specs import (
    BuiltImage,
    ForkSpec,
    LimitsSpec,
    LLMSpec,
    SandboxSpec,
    TaskSpec,
    ToolsSpec,
    VerifierSpec,
)

Problem = dict[str, Any]
N = TypeVar("N", int, float)
Loc = tuple[str | int, ...]

MAX_PATH_CHARS = 1024

# Resolving a submission against the server's defaults and maxima


def parse_submission(data: Mapping[str, Any]) -> TaskCreate:
    """A submission given as plain data (`sandhive run`'s options): InvalidInput, located as
    the API locates a request's validation errors, when it does not parse."""
    try:
        return TaskCreate.model_validate(data)
    except ValidationError as exc:
        problems = [
            problem(tuple(e["loc"]), e["msg"].removeprefix("Value error, "), e["type"])
            for e in exc.errors()
        ]
        raise InvalidInput(_summary(problems), details=problems) from None


def resolve_spec(
    body: TaskCreate,
    settings: Settings,
    *,
    tenant: str | None = None,
    own: Mapping[str, OwnImage] | None = None,
) -> TaskSpec:
    """Fill every default and check every maximum, reporting all violations at once.

    `tenant`: whose catalogue images the task may use (None: any, as for `sandhive run`).
    `own`: the tenant's own images (`built/NAME`) it may name besides the catalogue's.
    """
    problems: list[Problem] = []
    spec = TaskSpec(
        llm=_resolve_llm(body.llm, settings, problems),
        limits=_resolve_limits(body.limits, settings, problems),
        sandbox=_task_sandbox(body.sandbox, settings, problems, tenant, own or {}),
        tools=_resolve_tools(body.tools, settings, problems),
        **_resolve_prompt(body.prompt_config, settings, problems, vanilla=body.mode == "vanilla"),
        mode=body.mode,
        verifier=_resolve_verifier(body.verifier, settings, problems),
    )
    if body.mode == "vanilla" and body.tools.model_fields_set:
        msg = "a vanilla task offers the model no tools: leave tools out"
        problems.append(problem(("tools",), msg, "not_available"))
    if problems:
        raise InvalidInput(_summary(problems), details=problems)
    return spec


def resolve_fork(
    parent: TaskSpec,
    fork: ForkSpec,
    settings: Settings,
    *,
    llm: LLMOptions | None = None,
    limits: Limits | None = None,
) -> TaskSpec:
    """A fork's spec: the parent's, its model and limits replaced when given (resolved and
    checked as a task's are, all problems at once), without the parent's own webhook."""
    problems: list[Problem] = []
    update: dict[str, Any] = {"fork": fork, "webhook": None}
    if llm is not None:
        update["llm"] = _resolve_llm(llm, settings, problems)
    if limits is not None:
        update["limits"] = _resolve_limits(limits, settings, problems)
    if problems:
        raise InvalidInput(_summary(problems), details=problems)
    return parent.model_copy(update=update)


def profile_name(llm: LLMOptions, profiles: Mapping[str, LLMProfile]) -> str:
    """The profile a task runs on: the one it names, else `default`.

    On a server whose only profile is the scripted demo (`make run` before a real model is
    configured) a task that names none runs on `scripted`, so the docs' first examples work
    as pasted; its record says `"profile": "scripted"` and the page and the logs say so.
    """
    if "profile" in llm.model_fields_set or llm.profile in profiles:
        return llm.profile
    if list(profiles) == [SCRIPTED_PROFILE]:
        return SCRIPTED_PROFILE
    return llm.profile


def _resolve_llm(llm: LLMOptions, settings: Settings, problems: list[Problem]) -> LLMSpec:
    profiles = settings.llm_profiles()
    name = profile_name(llm, profiles)
    profile = profiles.get(name)
    if profile is None:
        problems.append(_unknown_profile(name, sorted(profiles)))
    model = llm.model or (profile.model if profile else "")
    if profile is not None and not model:
        problems.append(problem(("llm", "model"), "no model given and the profile has none"))
    elif profile is not None and not profile.allows(model):
        allowed = sorted({*profile.models, profile.model} - {""})
        msg = f"model {model!r} is not allowed by llm profile {name!r}"
        msg += f"; allowed: {', '.join(allowed)}"
        problems.append(problem(("llm", "model"), msg, "not_allowed", allowed=allowed))
    return LLMSpec(
        profile=name,
        model=model,
        temperature=_default(llm.temperature, settings.default_temperature),
        max_tokens_per_call=_bounded(
            problems,
            ("llm", "max_tokens_per_call"),
            llm.max_tokens_per_call,
            settings.default_max_tokens_per_call,
            settings.max_max_tokens_per_call,
        ),
        extra_body=llm.extra_body,
        base_url=_allowed_base_url(llm.base_url, settings, problems),
        capture=_capture(llm.capture or llm.tokens == "continuous", profile, problems),
        tokens=llm.tokens,
    )


def _allowed_base_url(url: str | None, settings: Settings, problems: list[Problem]) -> str | None:
    """A rollout's own model server, only when the operator listed it (no request forgery)."""
    if url is None:
        return None
    allowed = {entry.rstrip("/") for entry in settings.llm_allowed_base_urls}
    if url.rstrip("/") not in allowed:
        if allowed:
            msg = f"base_url {url!r} is not in SANDHIVE_LLM_ALLOWED_BASE_URLS"
        else:
            msg = "no base_url is allowed: the operator sets SANDHIVE_LLM_ALLOWED_BASE_URLS"
        problems.append(problem(("llm", "base_url"), msg, "not_allowed"))
    return url.rstrip("/")


def _capture(capture: bool, profile: LLMProfile | None, problems: list[Problem]) -> bool:
    """Token capture speaks the OpenAI-compatible wire format (vLLM, SGLang) only."""
    if capture and profile is not None and profile.kind != "openai":
        msg = "capture needs an OpenAI-compatible profile (vLLM, SGLang, ...)"
        problems.append(problem(("llm", "capture"), msg, "not_available"))
    return capture


def _unknown_profile(name: str, available: list[str]) -> Problem:
    """The problem of an unknown profile, naming the ones there are (or what to configure)."""
    if available:
        there = f"available: {', '.join(available)}"
    else:
        there = "none is configured (SANDHIVE_LLM_BASE_URL, or SANDHIVE_SCRIPTED_PROFILE=true)"
    msg = f"unknown llm profile {name!r}; {there}"
    return problem(("llm", "profile"), msg, "unknown_profile", available=available)


def _resolve_tools(tools: ToolsOptions, settings: Settings, problems: list[Problem]) -> ToolsSpec:
    """The multi-call policy made explicit: the task's, the server's, else the profile's."""
    if tools.shell == "persistent" and not settings.sandbox_exec_channel:
        msg = "a persistent shell needs the exec channel, which this server turned off"
        problems.append(problem(("tools", "shell"), msg, "not_available"))
    answer_all = tools.answer_all_tool_calls
    if answer_all is None:
        answer_all = settings.answer_all_tool_calls
    if answer_all is None:
        answer_all = tools.profile != "reference"
    return ToolsSpec(profile=tools.profile, answer_all_tool_calls=answer_all, shell=tools.shell)


def _resolve_prompt(
    choice: str | PromptPair, settings: Settings, problems: list[Problem], *, vanilla: bool
) -> dict[str, Any]:
    """`prompt_config` (the name) and `prompt` (templates and directories) for the TaskSpec.

    Vanilla: the default is the problem alone; a built-in config (written for the sandbox)
    is refused; a custom pair or a configs-directory file is the arm's own template.
    """
    if vanilla and choice == DEFAULT:
        prompt = vanilla_prompt(settings.sandbox_workdir)
        return {"prompt_config": prompt.name, "prompt": prompt}
    try:
        prompt = resolve_prompt(
            choice, workdir=settings.sandbox_workdir, configs_dir=settings.prompt_configs_dir
        )
    except InvalidInput as exc:
        problems.append(problem(("prompt_config",), exc.message))
        return {"prompt_config": choice if isinstance(choice, str) else CUSTOM, "prompt": None}
    if vanilla and is_sandbox_builtin(prompt):
        msg = f"{prompt.name!r} is a sandbox prompt; a vanilla task takes the default or its own"
        problems.append(problem(("prompt_config",), msg))
    size = len(prompt.system) + len(prompt.instance)
    if size > settings.max_prompt_chars:
        msg = f"templates longer than {settings.max_prompt_chars} characters"
        problems.append(problem(("prompt_config",), msg))
    return {"prompt_config": prompt.name, "prompt": prompt}


def _resolve_limits(limits: Limits, settings: Settings, problems: list[Problem]) -> LimitsSpec:
    s = settings
    return LimitsSpec(
        max_steps=_bounded(
            problems,
            ("limits", "max_steps"),
            limits.max_steps,
            s.default_max_steps,
            s.max_max_steps,
        ),
        timeout_s=_bounded(
            problems,
            ("limits", "timeout_s"),
            limits.timeout_s,
            s.default_timeout_s,
            s.max_timeout_s,
        ),
        command_timeout_s=_bounded(
            problems,
            ("limits", "command_timeout_s"),
            limits.command_timeout_s,
            s.default_command_timeout_s,
            s.max_command_timeout_s,
        ),
        max_context_tokens=_bounded(
            problems,
            ("limits", "max_context_tokens"),
            limits.max_context_tokens,
            s.default_max_context_tokens,
            s.max_max_context_tokens,
        ),
    )


def resolve_sandbox(
    box: SandboxRequest,
    settings: Settings,
    *,
    tenant: str,
    own: Mapping[str, Image] | None = None,
) -> SandboxSpec:
    """A sandbox request on its own (`/v1/sandboxes`), resolved as a task's is; 422 naming
    every problem. `own`: the tenant's own images (`built/NAME`), besides the catalogue."""
    problems: list[Problem] = []
    spec = _resolve_sandbox(box, settings, problems, tenant, own or {})
    if problems:
        raise InvalidInput(_summary(problems), details=problems)
    return spec


def _task_sandbox(
    box: SandboxRequest,
    settings: Settings,
    problems: list[Problem],
    tenant: str | None,
    own: Mapping[str, OwnImage],
) -> SandboxSpec:
    """A task's sandbox: as a sandbox's, and a tenant image's tag runs on its base's queue
    and caps, with what a worker lacking it needs to build it (`built`)."""
    images = {name: found.image for name, found in own.items()}
    spec = _resolve_sandbox(box, settings, problems, tenant, images)
    if not box.read_only_rootfs:
        if not settings.sandbox_allow_writable_rootfs:
            msg = "false is not allowed on this server (SANDHIVE_SANDBOX_ALLOW_WRITABLE_ROOTFS)"
            problems.append(problem(("sandbox", "read_only_rootfs"), msg, "policy"))
        spec = spec.model_copy(update={"read_only_rootfs": False})
    if box.snapshots != "off":
        spec = spec.model_copy(update={"snapshots": box.snapshots})
    found = own.get(box.image)
    if found is None or spec.image_name != box.image:
        return spec
    return spec.model_copy(update={"image_name": found.built.base, "built": found.built})


def _resolve_sandbox(
    box: SandboxRequest,
    settings: Settings,
    problems: list[Problem],
    tenant: str | None,
    own: Mapping[str, Image] | None = None,
) -> SandboxSpec:
    if box.network == "egress" and not settings.sandbox_egress_enabled:
        problems.append(problem(("sandbox", "network"), "egress is not enabled on this server"))
    image = _catalogue_image(box.image, settings, problems, tenant, own or {})
    return SandboxSpec(
        image=image.reference,
        image_name=image.name,
        network=box.network,
        cpus=_bounded(problems, ("sandbox", "cpus"), box.cpus, image.default_cpus, image.max_cpus),
        memory_mb=_bounded(
            problems,
            ("sandbox", "memory_mb"),
            box.memory_mb,
            image.default_memory_mb,
            image.max_memory_mb,
        ),
        disk_mb=_bounded(
            problems,
            ("sandbox", "disk_mb"),
            box.disk_mb,
            image.default_disk_mb,
            image.max_disk_mb,
        ),
        allow_domains=_allow_domains(box, settings, problems),
    )


def _allow_domains(box: SandboxRequest, settings: Settings, problems: list[Problem]) -> list[str]:
    """The names an egress-by-name sandbox may reach: the task's, within the server's ceiling,
    or the server's default list; a problem naming what is allowed otherwise."""
    proxied = box.network == "egress" and settings.sandbox_egress_proxy
    if box.allow_domains is None:
        return list(settings.sandbox_egress_default_domains) if proxied else []
    loc = ("sandbox", "allow_domains")
    if not proxied:
        problems.append(problem(loc, 'needs network "egress" on a server that filters by name'))
        return []
    ceiling = settings.sandbox_egress_domains
    try:
        asked = [normalize_pattern(item) for item in box.allow_domains]
    except ValueError as exc:
        problems.append(problem(loc, f"{exc} (names and *.suffix only)", allowed=ceiling))
        return []
    if wider := outside_ceiling(asked, ceiling):
        msg = f"not allowed on this server: {', '.join(wider)}; allowed: {', '.join(ceiling)}"
        problems.append(problem(loc, msg, "domain_not_allowed", allowed=ceiling))
    return asked


@dataclass(frozen=True)
class OwnImage:
    """One of the tenant's ready images: what it resolves as, and how it was built."""

    image: Image
    built: BuiltImage


def _catalogue_image(
    name: str,
    settings: Settings,
    problems: list[Problem],
    tenant: str | None,
    own: Mapping[str, Image],
) -> Image:
    """The named image when the tenant may use it; else a problem listing those it may (the
    same words for an unknown and a forbidden one: no tenant learns of another's images).
    Resolving goes on with `default`'s limits, so the other problems are still reported."""
    images = catalogue(settings)
    image = own.get(name) or images.get(name)
    if image is not None and image.allows(tenant):
        return image
    available = allowed(images, tenant) + sorted(own)
    msg = f"image {name!r} is not available; available: {', '.join(available) or 'none'}"
    problems.append(problem(("sandbox", "image"), msg, "unknown_image", available=available))
    return images[DEFAULT_IMAGE]


def _resolve_verifier(
    verifier: Verifier | None, settings: Settings, problems: list[Problem]
) -> VerifierSpec | None:
    """The verifier's files checked (relative paths, base64, the size cap) and its timeout."""
    if verifier is None:
        return None
    files: list[tuple[str, str]] = []
    seen: set[str] = set()
    total = 0
    for i, item in enumerate(verifier.files):
        loc: Loc = ("verifier", "files", i)
        path = item.path
        if path.startswith("/") or any(part in ("", ".", "..") for part in path.split("/")):
            msg = "must be a relative path without empty, '.' or '..' segments"
            problems.append(problem((*loc, "path"), msg))
        elif path in seen:
            problems.append(problem((*loc, "path"), f"duplicate path {path!r}"))
        seen.add(path)
        text = "".join(item.content_base64.split())
        try:
            total += len(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError):
            problems.append(problem((*loc, "content_base64"), "not valid base64"))
        files.append((path, text))
    for i, (path, _) in enumerate(files):
        if any(other.startswith(path + "/") for other in seen):
            msg = f"{path!r} is a file and a directory of other files at once"
            problems.append(problem(("verifier", "files", i, "path"), msg))
    if total > settings.verifier_max_bytes:
        msg = f"larger than {settings.verifier_max_bytes} bytes in total once decoded"
        problems.append(problem(("verifier", "files"), msg, "too_large"))
    timeout_s = _bounded(
        problems,
        ("verifier", "timeout_s"),
        verifier.timeout_s,
        min(settings.verifier_default_timeout_s, settings.verifier_max_timeout_s),
        settings.verifier_max_timeout_s,
    )
    return VerifierSpec(files=files, command=verifier.command, timeout_s=timeout_s)


def _default(value: N | None, default: N) -> N:
    return default if value is None else value


def _bounded(problems: list[Problem], loc: Loc, value: N | None, default: N, limit: N) -> N:
    """The requested value (or the default), noting a problem when it passes the server maximum."""
    if value is None:
        return default
    if value > limit:
        problems.append(
            problem(loc, f"must be at most {limit}", "less_than_equal", limit=limit, value=value)
        )
    return value


def problem(loc: Loc, msg: str, type_: str = "invalid", **extra: Any) -> Problem:
    """One violation, shaped like a request-validation error entry (loc, msg, type)."""
    return {"loc": ["body", *loc], "msg": msg, "type": type_, **extra}


def _summary(problems: list[Problem]) -> str:
    return "; ".join(f"{dotted(p['loc'][1:])}: {p['msg']}" for p in problems)


# Checking the bulky parts of a submission: prompt, metadata, input files


def check_inputs(body: TaskCreate, settings: Settings) -> list[tuple[str, bytes]]:
    """Check sizes and paths, and decode the input files (422 for bad input, 413 when too big)."""
    if len(body.prompt) > settings.max_prompt_chars:
        _reject(("prompt",), f"longer than {settings.max_prompt_chars} characters")
    meta_size = len(json.dumps(body.metadata, separators=(",", ":")).encode())
    if meta_size > settings.max_metadata_bytes:
        _reject(("metadata",), f"larger than {settings.max_metadata_bytes} bytes as JSON")
    if len(body.input_files) > settings.max_input_files:
        _reject(("input_files",), f"more than {settings.max_input_files} files")
    files: list[tuple[str, bytes]] = []
    seen: set[str] = set()
    total = 0
    for i, item in enumerate(body.input_files):
        _check_path(i, item.path, seen)
        content = _decode(i, item, settings.max_input_file_bytes)
        if body.mode == "vanilla":
            _check_text_file(i, content)
        total += len(content)
        if total > settings.max_input_total_bytes:
            _too_large(("input_files",), "in total", settings.max_input_total_bytes)
        files.append((item.path, content))
    return files


def _reject(loc: Loc, msg: str) -> NoReturn:
    raise InvalidInput(f"{dotted(loc)}: {msg}", details=[problem(loc, msg)])


def _too_large(loc: Loc, what: str, limit: int) -> NoReturn:
    msg = f"larger than {limit} bytes {what}".rstrip()
    raise TooLarge(f"{dotted(loc)}: {msg}", details=[problem(loc, msg, "too_large", limit=limit)])


def dotted(loc: Loc) -> str:
    return ".".join(map(str, loc))


def _check_path(i: int, path: str, seen: set[str]) -> None:
    """Relative, normalised, NUL-free and unique: it becomes /testbed/input/<path>."""
    loc = ("input_files", i, "path")
    if len(path) > MAX_PATH_CHARS or "\x00" in path:
        _reject(loc, f"must be at most {MAX_PATH_CHARS} characters without NUL")
    if path.startswith("/") or any(part in ("", ".", "..") for part in path.split("/")):
        _reject(loc, "must be a relative path without empty, '.' or '..' segments")
    if path in seen:
        _reject(loc, f"duplicate path {path!r}")
    seen.add(path)


def _check_text_file(i: int, content: bytes) -> None:
    """A vanilla task's input files are embedded in its message, so they must be text."""
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:
        _reject(
            ("input_files", i, "content_base64"), "a vanilla task's input files must be UTF-8 text"
        )


def _decode(i: int, item: InputFile, max_bytes: int) -> bytes:
    loc = ("input_files", i, "content_base64")
    text = "".join(item.content_base64.split())  # tolerate line-wrapped base64 (`base64` CLI)
    # Four characters carry three bytes: refuse before decoding something huge.
    if len(text) // 4 * 3 > max_bytes + 3:
        _too_large(loc, "once decoded", max_bytes)
    try:
        content = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):  # ValueError: non-ASCII characters
        _reject(loc, "not valid base64")
    if len(content) > max_bytes:
        _too_large(loc, "once decoded", max_bytes)
    return content
