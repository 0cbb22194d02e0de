"""Prompt configs: the system and first user message of a task, in Sandhive's own words.

Imported by whoever builds an `AgentSpec` (worker, `sandhive run`). "general"
has the sections and intent of the reference package's default config
(REFERENCE.md §1.6) without copying its prose. Placeholders are filled by plain
replacement, so braces in a problem statement need no escaping.
"""

from __future__ import annotations

from app.errors import InvalidInput

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

PROMPT_CONFIGS: dict[str, tuple[str, str]] = {"general": (GENERAL_SYSTEM, GENERAL_INSTANCE)}
"""prompt_config name -> (system template, instance template)."""


def render_prompts(
    prompt_config: str,
    problem: str,
    *,
    workdir: str = "/testbed",
    input_dir: str = "/testbed/input",
    output_dir: str = "/testbed/output",
) -> tuple[str, str]:
    """(system, user) for one task; the problem goes in last so its text is never expanded."""
    try:
        system, instance = PROMPT_CONFIGS[prompt_config]
    except KeyError:
        known = ", ".join(sorted(PROMPT_CONFIGS))
        raise InvalidInput(f"unknown prompt_config {prompt_config!r}; known: {known}") from None
    dirs = {"{working_dir}": workdir, "{input_dir}": input_dir, "{output_dir}": output_dir}
    for placeholder, value in dirs.items():
        system = system.replace(placeholder, value)
        instance = instance.replace(placeholder, value)
    return system, instance.replace("{problem_statement}", problem)
