"""Prompt configs: the system prompt, the first user message and the sandbox directories.

A leaf module (stdlib, pyyaml, `app.errors`, `app.schemas.tasks`): the task service
resolves a config when a task is submitted (`resolve_prompt`, 422 for an unknown
or broken one) and stores the result in the task's spec; the worker and
`sandhive run` turn it into messages (`render_prompts`).

Built in: "general" (the default) and the paper benchmark's six domains, in
Sandhive's own words with the reference package's structure and conventions
(REFERENCE.md §1.6): domain configs put the answer in `/testbed/answer.txt`
(output_dir = the working directory), math and physics answers in `\\boxed{}`,
long-context documents in `/testbed/documents`. A server may add or replace
configs with YAML files in the package's own format (`system_prompt`,
`instance_prompt`, `working_dir`, `input_dir`, `output_dir`), so the package's
original files can be used as they are.

Placeholders follow the package exactly: `{working_dir}`, `{input_dir}` and
`{output_dir}` are replaced as plain text first; then the system prompt goes
through `str.format(command_docs="", demo="")` and the instance prompt through
`str.format(problem_statement=...)`, so any other literal brace is written
doubled (`\\boxed{{}}`). An empty instance prompt sends the problem as it is.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml

from app.errors import InvalidInput
from app.schemas.tasks import PromptPair
from app.specs import PromptSpec

CUSTOM = "custom"
"""The name a task's own {system, instance} pair is stored under."""
DEFAULT = "general"
VANILLA = "vanilla"
"""The name a vanilla task's default prompt (the problem alone) is stored under."""
_LOC = ["body", "prompt_config"]


@dataclass(frozen=True)
class BuiltinConfig:
    system: str
    instance: str
    input_subdir: str = "input"
    output_subdir: str = "output"
    """Relative to the working directory; "" is the working directory itself."""


# ---------------------------------------------------------------- general (the default)

GENERAL_SYSTEM = """You are an expert problem solver who works by writing and running code \
on a Linux computer that is yours for this task.

<TASK>
You will be given a problem. Solve it by exploring the computer, writing programs, running \
them and checking what they produce. Keep going until the problem is solved; nobody will \
answer questions along the way.
</TASK>

<DIRECTORIES>
- Working directory: {working_dir}
- Input files (if the task has any): {input_dir}
- Output directory: {output_dir} (everything you produce goes here)
</DIRECTORIES>

<WORKFLOW>
1. Read the problem carefully and work out what exactly is asked.
2. Look in {input_dir} for files that come with the task.
3. Plan how to compute or build the answer.
4. Write your code to a file and run it; do not do the work in your head. Check the results \
and fix what is wrong.
5. Save the final answer and any files you were asked for in {output_dir}.
</WORKFLOW>

<IMPORTANT_NOTES>
- `execute_bash` runs shell commands: run programs, install packages, inspect files.
- `str_replace_editor` views, creates and edits files.
- Call `submit` once the outputs are saved; that ends the task.
</IMPORTANT_NOTES>

<ENCOURAGED_APPROACHES>
- Install whatever packages or tools help (pip, apt, ...).
- Prefer well-tested libraries over hand-written algorithms.
- Where it helps, fetch outside data or run simulations to check your reasoning.
</ENCOURAGED_APPROACHES>

<ANTI_HARDCODING>
- Your code must really compute its results: do not print or write down an answer you \
decided beforehand.
- Do not put your reasoning into code comments or print statements; think in your replies, \
compute in the code.
</ANTI_HARDCODING>"""

GENERAL_INSTANCE = """<problem>
{problem_statement}
</problem>

Solve the problem above.

<OUTPUT_INSTRUCTIONS>
- If the task asks for a single answer (a number, a word, a choice, a short text), write only \
that answer, as plain text, to {output_dir}/answer.txt.
- If the task asks for files or a project, save them in {output_dir}/.
</OUTPUT_INSTRUCTIONS>

Working directory: {working_dir}
Input directory: {input_dir}
Output directory: {output_dir}"""


# ---------------------------------------------------------------- the benchmark's domains


def _domain_system(role: str, task: str, workflow: str, notes: str) -> str:
    """The domain configs share the general skeleton; these four parts differ."""
    return f"""You are {role}, and you work by writing and running code on a Linux computer \
that is yours for this task.

<TASK>
{task}
</TASK>

<DIRECTORIES>
- Working directory: {{working_dir}}
- Input files (if the task has any): {{input_dir}}
- Your final answer goes to: {{output_dir}}/answer.txt
</DIRECTORIES>

<WORKFLOW>
{workflow}
</WORKFLOW>

<IMPORTANT_NOTES>
- `execute_bash` runs shell commands; `str_replace_editor` views, creates and edits files.
{notes}
- Call `submit` once {{output_dir}}/answer.txt is written; that ends the task.
</IMPORTANT_NOTES>

<ANTI_HARDCODING>
- Let your code compute what can be computed; never write down a result you did not check.
- Keep your reasoning in your replies, not in code comments or print statements.
</ANTI_HARDCODING>"""


def _domain_instance(answer_rule: str) -> str:
    return f"""<problem>
{{problem_statement}}
</problem>

Solve the problem above.

<OUTPUT_INSTRUCTIONS>
{answer_rule}
</OUTPUT_INSTRUCTIONS>

Working directory: {{working_dir}}
Input directory: {{input_dir}}
Answer file: {{output_dir}}/answer.txt"""


# Doubled braces survive str.format as single ones: the model reads \boxed{...}.
_BOXED_FILE_NOTE = (
    "- Write answer.txt with the editor, a quoted heredoc (<<'EOF') or printf '%s', so that "
    "the backslash in \\boxed is not read as an escape sequence."
)

MATH = BuiltinConfig(
    system=_domain_system(
        "a mathematician who checks every claim by computation",
        "You will be given a competition-style mathematics problem with one exact answer. "
        "Find it, and verify it with code (symbolic algebra, exact arithmetic, brute force on "
        "small cases) rather than trusting a single line of reasoning.",
        "1. Restate what is asked and what form the answer takes.\n"
        "2. Explore small cases or simplify with code (sympy, fractions, itertools).\n"
        "3. Derive the answer, then confirm it a second, independent way.\n"
        "4. Write the final answer to the answer file.",
        _BOXED_FILE_NOTE,
    ),
    instance=_domain_instance(
        "Write your final answer to {output_dir}/answer.txt in the form \\boxed{{ANSWER}}, "
        "e.g. \\boxed{{42}}: exact, simplified, and nothing else in the file."
    ),
    output_subdir="",
)

PHYSICS = BuiltinConfig(
    system=_domain_system(
        "a physicist who models problems numerically and symbolically",
        "You will be given a physics problem. Set up the model, solve it with code (sympy for "
        "the algebra, numpy/scipy for numbers, simulations where useful) and check units and "
        "limiting cases.",
        "1. Identify the physical laws involved and the quantity asked for.\n"
        "2. Solve symbolically where you can, numerically where you must.\n"
        "3. Check units, orders of magnitude and special cases.\n"
        "4. Write the final answer to the answer file.",
        _BOXED_FILE_NOTE,
    ),
    instance=_domain_instance(
        "Write your final answer to {output_dir}/answer.txt as \\boxed{{ANSWER}}, with units "
        "where the quantity has them, and nothing else in the file."
    ),
    output_subdir="",
)

_LETTER_RULE = (
    "This is a multiple-choice question. Write only the letter of the correct option "
    "(for example: B) to {output_dir}/answer.txt."
)

CHEM = BuiltinConfig(
    system=_domain_system(
        "a chemist who uses computational tools",
        "You will be given a chemistry question with answer options. Work it out with code "
        "where that helps (stoichiometry, equilibria, RDKit or other libraries you install), "
        "then choose the correct option.",
        "1. Read the question and every option.\n"
        "2. Compute or look up what decides between the options.\n"
        "3. Eliminate the wrong options and pick the right one.\n"
        "4. Write the letter to the answer file.",
        "- Install domain libraries with pip when they help (e.g. rdkit, pubchempy).",
    ),
    instance=_domain_instance(_LETTER_RULE),
    output_subdir="",
)

BIOMED = BuiltinConfig(
    system=_domain_system(
        "a biomedical expert who reasons carefully and checks facts with tools",
        "You will be given a medical or biological question with answer options. Reason "
        "through the case, use code and libraries where they help (calculations, sequence "
        "tools, data), and choose the best option.",
        "1. Summarise the key findings in the question.\n"
        "2. Consider each option against those findings.\n"
        "3. Verify calculations or facts with code where you can.\n"
        "4. Write the letter of the best option to the answer file.",
        "- Install domain libraries with pip when they help (e.g. biopython).",
    ),
    instance=_domain_instance(_LETTER_RULE),
    output_subdir="",
)

LONG_CONTEXT = BuiltinConfig(
    system=_domain_system(
        "an analyst who answers questions about long documents",
        "You will be given a question about a set of documents stored in {input_dir}. They are "
        "too long to read at once: search, extract and compute over them with tools and code, "
        "then answer from what they actually say.",
        "1. List {input_dir} and find out what each document is.\n"
        "2. Search them (grep, Python) for the passages the question depends on.\n"
        "3. Extract the facts and compute anything the question asks for.\n"
        "4. Write the answer to the answer file.",
        "- Read documents in parts (head, sed -n, grep -n, Python) instead of printing them whole.",
    ),
    instance=_domain_instance(
        "The documents are in {input_dir}. Write your final answer, as plain text, to "
        "{output_dir}/answer.txt."
    ),
    input_subdir="documents",
    output_subdir="",
)

INSTRUCT_FOLLOW = BuiltinConfig(
    system=_domain_system(
        "a careful writer who follows every instruction exactly",
        "You will be given a writing request with explicit constraints (length, format, "
        "words to use or avoid, structure). Produce the response and use code to check every "
        "constraint that can be counted or tested.",
        "1. List every constraint in the request.\n"
        "2. Draft the response in a file.\n"
        "3. Check each constraint with code (word counts, forbidden words, format) and fix the "
        "draft until all pass.\n"
        "4. Save the final response as the answer file.",
        "- The answer file is graded as it is: it must contain the response only, with no "
        "notes or explanations.",
    ),
    instance=_domain_instance(
        "Write the complete response, and nothing else, to {output_dir}/answer.txt."
    ),
    output_subdir="",
)

BUILTIN: dict[str, BuiltinConfig] = {
    DEFAULT: BuiltinConfig(GENERAL_SYSTEM, GENERAL_INSTANCE),
    "math": MATH,
    "physics": PHYSICS,
    "chem": CHEM,
    "biomed": BIOMED,
    "long_context": LONG_CONTEXT,
    "instruct_follow": INSTRUCT_FOLLOW,
}


# ---------------------------------------------------------------- resolving and rendering


def resolve_prompt(
    choice: str | PromptPair, *, workdir: str, configs_dir: Path | None = None
) -> PromptSpec:
    """The config a task asked for, checked; InvalidInput (422) when unknown or broken."""
    if isinstance(choice, PromptPair):
        spec = _from_parts(
            CUSTOM,
            choice.system,
            choice.instance,
            dirs=(choice.working_dir, choice.input_dir, choice.output_dir),
            workdir=workdir,
        )
    elif choice == CUSTOM:
        _reject(f"{CUSTOM!r} is reserved for a task's own {{system, instance}} pair")
    elif (path := _yaml_path(configs_dir, choice)) is not None:
        spec = _from_yaml(choice, path, workdir)
    elif choice in BUILTIN:
        spec = _from_builtin(choice, BUILTIN[choice], workdir)
    else:
        known = ", ".join(known_names(configs_dir))
        _reject(f"unknown prompt_config {choice!r}; known: {known}")
    check_renders(spec)
    return spec


def vanilla_prompt(workdir: str) -> PromptSpec:
    """A vanilla task's default: no system prompt, the problem as the one user message."""
    return _from_parts(VANILLA, "", "", dirs=(None, None, None), workdir=workdir)


def is_sandbox_builtin(spec: PromptSpec) -> bool:
    """A built-in config as it is (not replaced by a file): its words are about the sandbox."""
    config = BUILTIN.get(spec.name)
    return config is not None and (spec.system, spec.instance) == (config.system, config.instance)


def load_prompt_file(path: Path, *, workdir: str) -> PromptSpec:
    """A prompt file in the package's YAML format from anywhere (`sandhive run --prompt-config`)."""
    spec = _from_yaml(path.stem, path, workdir)
    check_renders(spec)
    return spec


def stored_prompt(prompt: PromptSpec | None, name: str, *, workdir: str) -> PromptSpec:
    """A task's resolved prompt; tasks stored before it was resolved at submit use a built-in."""
    if prompt is not None:
        return prompt
    return _from_builtin(name, BUILTIN.get(name, BUILTIN[DEFAULT]), workdir)


def known_names(configs_dir: Path | None = None) -> list[str]:
    """Built-in names and the YAML files of the configs directory, sorted."""
    names = set(BUILTIN)
    if configs_dir is not None and configs_dir.is_dir():
        names.update(p.stem for p in configs_dir.iterdir() if p.suffix in (".yaml", ".yml"))
    names.discard(CUSTOM)
    return sorted(names)


def render_prompts(spec: PromptSpec, problem: str) -> tuple[str, str]:
    """(system message, first user message), by the package's placeholder rules."""
    return _render_system(spec), _render_instance(spec, problem)


def _render_system(spec: PromptSpec) -> str:
    return _replace_dirs(spec.system, spec).format(command_docs="", demo="")


def _render_instance(spec: PromptSpec, problem: str) -> str:
    instance = _replace_dirs(spec.instance, spec)
    if not instance.strip():
        return problem
    return instance.format(problem_statement=problem)


def check_renders(spec: PromptSpec) -> None:
    """Refuse templates that `render_prompts` would choke on (stray braces, unknown names)."""
    for part in ("system", "instance"):
        try:
            if part == "system":
                _render_system(spec)
            else:
                _render_instance(spec, "x")
        except (KeyError, IndexError, ValueError) as exc:
            _reject(
                f"prompt_config {spec.name!r}: the {part} template does not format "
                f"({type(exc).__name__}: {exc}); write literal braces doubled, {{{{ and }}}}"
            )


def _replace_dirs(template: str, spec: PromptSpec) -> str:
    return (
        template.replace("{working_dir}", spec.working_dir)
        .replace("{input_dir}", spec.input_dir)
        .replace("{output_dir}", spec.output_dir)
    )


def _from_builtin(name: str, config: BuiltinConfig, workdir: str) -> PromptSpec:
    return PromptSpec(
        name=name,
        system=config.system,
        instance=config.instance,
        working_dir=workdir,
        input_dir=_join(workdir, config.input_subdir),
        output_dir=_join(workdir, config.output_subdir),
    )


def _from_yaml(name: str, path: Path, workdir: str) -> PromptSpec:
    """A file in the package's format; its directories default as the package's CLI does."""
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        _reject(f"prompt_config {name!r}: cannot read {path.name} ({type(exc).__name__})")
    if not isinstance(data, dict) or not isinstance(data.get("system_prompt"), str):
        _reject(f"prompt_config {name!r}: {path.name} has no system_prompt text")
    dirs = (
        _optional_text(data, "working_dir"),
        _optional_text(data, "input_dir"),
        _optional_text(data, "output_dir"),
    )
    instance = _optional_text(data, "instance_prompt") or ""
    return _from_parts(name, data["system_prompt"], instance, dirs=dirs, workdir=workdir)


def _from_parts(
    name: str,
    system: str,
    instance: str,
    *,
    dirs: tuple[str | None, str | None, str | None],
    workdir: str,
) -> PromptSpec:
    working_dir, input_dir, output_dir = dirs
    spec = PromptSpec(
        name=name,
        system=system,
        instance=instance,
        working_dir=working_dir or workdir,
        input_dir=input_dir or _join(workdir, "input"),
        output_dir=output_dir or _join(workdir, "output"),
    )
    _check_dirs(spec, workdir)
    return spec


def _check_dirs(spec: PromptSpec, workdir: str) -> None:
    """Absolute, normal, and inside the sandbox's working directory (the writable part)."""
    if spec.working_dir.rstrip("/") != workdir.rstrip("/"):
        _reject(
            f"prompt_config {spec.name!r}: working_dir must be the sandbox's working "
            f"directory {workdir}, got {spec.working_dir!r}"
        )
    for key in ("input_dir", "output_dir"):
        value = getattr(spec, key)
        inside = value == workdir or value.startswith(workdir.rstrip("/") + "/")
        if posixpath.normpath(value) != value.rstrip("/") or not inside:
            _reject(
                f"prompt_config {spec.name!r}: {key} must be a normalised absolute path "
                f"inside {workdir}, got {value!r}"
            )


def _yaml_path(configs_dir: Path | None, name: str) -> Path | None:
    if configs_dir is None:
        return None
    for suffix in (".yaml", ".yml"):
        candidate = configs_dir / f"{name}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def _optional_text(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None or isinstance(value, str):
        return value
    _reject(f"prompt config key {key!r} must be text")


def _join(workdir: str, sub: str) -> str:
    return posixpath.join(workdir, sub) if sub else workdir


def _reject(message: str) -> NoReturn:
    """The 422, located at the task's `prompt_config`."""
    raise InvalidInput(message, details=[{"loc": _LOC, "msg": message, "type": "value_error"}])
