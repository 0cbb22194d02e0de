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

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from app.agent.types import ChatModel, Step
from app.config import Settings
from app.episode import EpisodeResult, build_episode, collect_caps, run_episode
from app.prompt_configs import DEFAULT, resolve_prompt
from app.sandbox.docker import DockerHost
from app.sandbox.files import CollectedFile
from app.schemas import LimitsSpec, PromptSpec, SandboxSpec, ToolsOptions
from app.trajectory_format import reference_trajectory


@dataclass(frozen=True)
class LocalRun:
    prompt: str
    max_steps: int = 100
    timeout_s: int = 1800
    command_timeout_s: int = 120
    max_context_tokens: int = 65536
    tools_profile: str = "standard"
    shell: str = "fresh"
    output_root: Path = Path("output")
    inputs: Sequence[tuple[str, bytes]] = ()
    prompt_config: PromptSpec | None = None
    """Resolved by the caller (`prompt_configs.resolve_prompt`); None: "general"."""
    answer_all_tool_calls: bool | None = None


class TerminalSink:
    """Prints steps as panels; implements app.agent.types.EventSink."""

    def __init__(self, console: Console) -> None:
        self.console = console

    async def step_started(self, index: int) -> None:
        self.console.rule(f"step {index}")

    async def step_completed(self, step: Step, next_index: int | None = None) -> None:
        # Text() rather than a str: model and tool output are not Rich markup.
        if step.reasoning:
            self._panel(step.reasoning[:2000], "reasoning", "dim")
        if step.thought:
            self._panel(step.thought[:1000], "thought", "")
        if step.action is not None:
            args = json.dumps(step.action.arguments, ensure_ascii=False)[:300]
            self._panel(args, f"action: {step.action.tool}", "cyan")
        self._panel(step.observation[:800], "observation", "green")
        if next_index is not None:
            await self.step_started(next_index)

    def _panel(self, text: str, title: str, style: str) -> None:
        self.console.print(Panel(Text(text), title=Text(title), style=style))

    async def live(self, kind: str, data: Mapping[str, object]) -> None:
        return None


async def run_local(
    settings: Settings, model: ChatModel, run: LocalRun, console: Console
) -> tuple[EpisodeResult, Path]:
    """Run one task locally and write its outputs; returns the result and the run folder."""
    workdir = settings.sandbox_workdir
    episode = build_episode(
        settings,
        run.prompt_config or resolve_prompt(DEFAULT, workdir=workdir),
        run.prompt,
        limits=LimitsSpec(
            max_steps=run.max_steps,
            timeout_s=run.timeout_s,
            command_timeout_s=run.command_timeout_s,
            max_context_tokens=run.max_context_tokens,
        ),
        tools=ToolsOptions(
            profile=run.tools_profile,  # type: ignore[arg-type]
            answer_all_tool_calls=run.answer_all_tool_calls,
            shell=run.shell,  # type: ignore[arg-type]
        ),
        sandbox=SandboxSpec(
            image=settings.sandbox_image,
            network="none",
            cpus=settings.default_cpus,
            memory_mb=settings.default_memory_mb,
            disk_mb=settings.default_disk_mb,
        ),
        labels={"sandhive.local": "1"},
        inputs=run.inputs,
    )
    async with DockerHost(exec_channel=settings.sandbox_exec_channel) as host:
        result = await run_episode(
            host, model, episode, TerminalSink(console), collect_caps(settings)
        )
    folder = write_outputs(run.output_root, run.prompt, result)
    return result, folder


def write_outputs(root: Path, prompt: str, result: EpisodeResult) -> Path:
    """`<root>/<timestamp>/files/` and `trajectory.json`, as the reference package leaves them."""
    folder = _new_run_folder(root)
    files_dir = folder / "files"
    files_dir.mkdir()
    for item in result.files:
        _write_file(files_dir, item)
    trajectory = reference_trajectory(prompt, result.outcome.steps)
    (folder / "trajectory.json").write_text(
        json.dumps(trajectory, indent=2, ensure_ascii=False), encoding="utf-8"
    )
    return folder


def _new_run_folder(root: Path) -> Path:
    """`<YYYYMMDD_HHMMSS>` like the package; `_2`, `_3`... when a run already took that second."""
    stamp = datetime.now().strftime("%Y%m%d_%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        folder = root / (stamp if attempt == 1 else f"{stamp}_{attempt}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"no free run folder for {stamp} in {root}")


def _write_file(files_dir: Path, item: CollectedFile) -> None:
    # The collector already refused absolute and escaping names; check again at the host edge.
    target = (files_dir / item.path).resolve()
    if not target.is_relative_to(files_dir.resolve()):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(item.content)
