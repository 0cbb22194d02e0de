"""`sandhive run`: the worker's episode in one process, with no Postgres and no Redis.

Prints each step to the terminal as it happens and leaves, like the paper's own
command line tool, `<output>/<YYYYMMDD_HHMMSS>/files/` and `trajectory.json`
in the reference package's format (REFERENCE.md §1.7).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel

from app.agent.prompts import render_prompts
from app.agent.types import AgentSpec, ChatModel, Step
from app.config import Settings
from app.episode import Episode, EpisodeResult, collect_caps, run_episode
from app.sandbox.docker import DockerHost
from app.sandbox.files import CollectedFile
from app.sandbox.policy import SandboxConfig


@dataclass(frozen=True)
class LocalRun:
    prompt: str
    max_steps: int = 100
    timeout_s: int = 1800
    command_timeout_s: int = 120
    max_context_tokens: int = 65536
    tools_profile: str = "standard"
    output_root: Path = Path("output")
    inputs: Sequence[tuple[str, bytes]] = ()


class TerminalSink:
    """Prints steps as panels; implements app.agent.types.EventSink."""

    def __init__(self, console: Console) -> None:
        self.console = console

    async def step_started(self, index: int) -> None:
        self.console.rule(f"step {index}")

    async def step_completed(self, step: Step) -> None:
        if step.reasoning:
            self.console.print(Panel(step.reasoning[:2000], title="reasoning", style="dim"))
        if step.thought:
            self.console.print(Panel(step.thought[:1000], title="thought"))
        if step.action is not None:
            args = json.dumps(step.action.arguments, ensure_ascii=False)[:300]
            self.console.print(Panel(args, title=f"action: {step.action.tool}", style="cyan"))
        self.console.print(Panel(step.observation[:800], title="observation", style="green"))

    async def live(self, kind: str, data: Mapping[str, object]) -> None:
        return None


async def run_local(
    settings: Settings, model: ChatModel, run: LocalRun, console: Console
) -> tuple[EpisodeResult, Path]:
    """Run one task locally and write its outputs; returns the result and the run folder."""
    workdir = settings.sandbox_workdir
    system, user = render_prompts(
        "general",
        run.prompt,
        workdir=workdir,
        input_dir=f"{workdir}/input",
        output_dir=f"{workdir}/output",
    )
    episode = Episode(
        agent=AgentSpec(
            system_prompt=system,
            user_prompt=user,
            max_steps=run.max_steps,
            timeout_s=run.timeout_s,
            command_timeout_s=run.command_timeout_s,
            max_context_tokens=run.max_context_tokens,
            tools_profile=run.tools_profile,
            workdir=workdir,
        ),
        sandbox=SandboxConfig(
            image=settings.sandbox_image,
            labels={"sandhive.local": "1"},
            pids_limit=settings.sandbox_pids_limit,
            workdir=workdir,
        ),
        inputs=run.inputs,
        input_dir=f"{workdir}/input",
        output_dir=f"{workdir}/output",
    )
    async with DockerHost() as host:
        result = await run_episode(
            host, model, episode, TerminalSink(console), collect_caps(settings)
        )
    folder = write_outputs(run.output_root, run.prompt, result)
    return result, folder


def write_outputs(root: Path, prompt: str, result: EpisodeResult) -> Path:
    """`<root>/<timestamp>/files/` and `trajectory.json`, as the reference package leaves them."""
    folder = root / datetime.now().strftime("%Y%m%d_%H%M%S")
    files_dir = folder / "files"
    files_dir.mkdir(parents=True, exist_ok=True)
    for item in result.files:
        _write_file(files_dir, item)
    trajectory = reference_trajectory(prompt, result.outcome.steps)
    (folder / "trajectory.json").write_text(
        json.dumps(trajectory, indent=2, ensure_ascii=False), encoding="utf-8"
    )
    return folder


def reference_trajectory(prompt: str, steps: Sequence[Step]) -> dict[str, Any]:
    """The package's trajectory.json: problem_statement, steps[...], metadata.total_steps."""
    return {
        "problem_statement": prompt,
        "steps": [
            {
                "thought": step.thought,
                "reasoning_content": step.reasoning,
                "action": {
                    "function": step.action.tool if step.action else "",
                    "parameters": step.action.arguments if step.action else {},
                },
                "observation": step.observation,
                "metadata": {"step": step.index, "exec_time": step.llm_ms / 1000},
            }
            for step in steps
        ],
        "metadata": {"total_steps": len(steps)},
    }


def _write_file(files_dir: Path, item: CollectedFile) -> None:
    # The collector already refused absolute and escaping names; check again at the host edge.
    target = (files_dir / item.path).resolve()
    if not target.is_relative_to(files_dir.resolve()):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(item.content)
