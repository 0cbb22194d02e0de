"""The paper's RL environment, `LLMinSandboxEnv` of its rLLM repository, on Sandhive episodes.

That repository's training script builds its environments with `from_dict(extra_info)`
from a dataset row and calls `reset`, `step(action)`, `compute_final_reward` and `close`
from a thread pool (shared/REFERENCE.md §3). This class keeps that contract, so the script
runs against Sandhive by importing this class instead: each `reset` opens an episode
(`POST /v1/episodes`) whose sandbox, tools and observations are the package's (the
`reference` tools profile), with the row's input files in its input directory.

- `from_dict` takes the row as the repository's does: `docker_image`, `step_timeout`,
  `verbose`, `working_dir`, `input_dir`, `output_dir` are popped; the rest is the row
  (`problem_statement`, `ground_truth`, `domain`, `qa_type`, `input_files`, ...). The
  service is `SANDHIVE_URL` with the key `SANDHIVE_API_KEY` (the script passes nothing
  else), or a `client` given to the constructor.
- `step(action)` takes what that repository's agent produces: the package's `Action`
  (`function_name`, `parameters`), rLLM's wrapper of one (`.action`), or its dict form;
  it answers `(observation, 0.0, done, {})` with the package's exact observation text
  (the agent adds "Steps Remaining" itself, so the episode's suffix is taken off) and
  `done` when the call was `submit` or the episode ended itself (its step limit, time).
- `compute_final_reward()` scores the answer file (`<output_dir>/answer.txt`) with the
  scorer of the row's domain, as the package's `instruct_pretrain` router does
  (`SCORERS_BY_DOMAIN`); a row may name its own `scorer` instead. An episode the trainer
  stops before it ends is closed and scores 0 (the script's `overlong_step_penalty`
  zeroes those anyway). An infrastructure failure raises `EpisodeError` (`infrastructure`
  set): never a 0.

Only HTTP: a trainer needs httpx and this module.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import httpx

from app.clients.episode_env import Env, EpisodeError, client_from_environment

PACKAGE_IMAGE = "cdx123/llm-in-sandbox:v0.1"
"""The package's default image, which is Sandhive's `default` sandbox image."""
WORKDIR = "/testbed"
STEPS_REMAINING = re.compile(r"\nSteps Remaining: \d+$")
SCORERS_BY_DOMAIN: tuple[tuple[str, dict[str, Any]], ...] = (
    ("math", {"kind": "math", "package": True}),
    ("physics", {"kind": "math", "package": True}),
    ("chem", {"kind": "mcq", "package": True}),
    ("biomed", {"kind": "mcq", "package": True}),
    ("instruct_follow", {"kind": "instruction_following"}),
)
"""The `instruct_pretrain` reward router's first rule, by the domain's prefix. Other rows
(`instruct_pretrain`, `long_context`) are routed by `qa_type`: a single-answer multiple
choice as `biomed`, anything else ROUGE-L (the router tries math-verify first, which
Sandhive does not chain: give such rows a `scorer` where it matters)."""


def scorer_for_row(row: dict[str, Any]) -> dict[str, Any]:
    """The scorer spec the package's router would use for this row."""
    if isinstance(row.get("scorer"), dict):
        return dict(row["scorer"])
    domain = str(row.get("domain") or "").lower()
    for prefix, spec in SCORERS_BY_DOMAIN:
        if domain.startswith(prefix):
            return dict(spec)
    qa_type = str(row.get("qa_type") or "").lower()
    if "multiple choice" in qa_type and "," not in str(row.get("ground_truth") or ""):
        return {"kind": "mcq", "package": True}
    return {"kind": "rouge_l"}


class LLMinSandboxEnv:
    """`LLMinSandboxEnv`'s contract, each environment one Sandhive episode at a time."""

    def __init__(
        self,
        row: dict[str, Any],
        *,
        client: httpx.Client | None = None,
        image: str = "default",
        input_dir: str | None = None,
        output_dir: str | None = None,
        max_steps: int = 100,
    ) -> None:
        self.row = row
        self.owns_client = client is None  # made from the environment: closed by `close`
        self.client = client or client_from_environment()
        self.input_dir = input_dir or f"{WORKDIR}/documents"
        self.output_dir = output_dir or WORKDIR
        self.env = Env(self.client, self._spec(image, max_steps))

    @classmethod
    def from_dict(cls, extra_info: dict[str, Any]) -> LLMinSandboxEnv:
        row = dict(extra_info)
        image = row.pop("docker_image", PACKAGE_IMAGE)
        for ignored in ("step_timeout", "verbose"):  # the package never applies its timeout
            row.pop(ignored, None)
        working_dir = row.pop("working_dir", WORKDIR)
        if str(working_dir).rstrip("/") != WORKDIR:
            raise ValueError(f"working_dir must be {WORKDIR} (the sandbox's), got {working_dir!r}")
        return cls(
            row,
            image="default" if image == PACKAGE_IMAGE else str(image),
            input_dir=row.pop("input_dir", None),
            output_dir=row.pop("output_dir", None),
        )

    def reset(self) -> tuple[str, dict[str, Any]]:
        """A new episode (the previous one closed): the task and the row."""
        if self.client.is_closed:  # reset again after `close`
            self.client = self.env.client = client_from_environment()
        self.env.reset()
        return str(self.row["problem_statement"]), {"extra_info": self.row}

    def step(self, action: Any) -> tuple[str, float, bool, dict[str, Any]]:
        name, parameters = _call_of(action)
        call = {
            "id": f"call_{len(self.env.messages)}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(parameters)},
        }
        result = self.env.step({"role": "assistant", "content": "", "tool_calls": [call]})
        if result.infrastructure:  # the service failed, not the policy: no observation
            details = {"error_kind": "infrastructure", "finish_reason": result.finish_reason}
            raise EpisodeError(
                503, {"error": {"message": result.info.get("error"), "details": details}}
            )
        text = str(result.messages[0].get("content", "")) if result.messages else ""
        # Done at `submit`, or when the episode ended itself (its step limit or timeout).
        return STEPS_REMAINING.sub("", text), 0.0, result.done or name == "submit", {}

    def compute_final_reward(self) -> float:
        """The answer file's score; 0 for an episode stopped before it ended."""
        if self.env.id is None:
            return 0.0
        try:
            return self.env.reward()
        except EpisodeError as exc:
            if exc.infrastructure or exc.status != 409 or "not ended" not in str(exc):
                raise
        self.env.close()  # stopped by the trainer (its own step or token budget)
        return 0.0

    def close(self) -> None:
        self.env.close()
        if self.owns_client:
            self.client.close()

    @staticmethod
    def is_multithread_safe() -> bool:
        return True

    def _spec(self, image: str, max_steps: int) -> dict[str, Any]:
        files = self.row.get("input_files") or {}
        if isinstance(files, str):
            files = json.loads(files) if files.strip() else {}
        relative = self.input_dir.removeprefix(WORKDIR).strip("/")
        input_files = [
            {"path": path, "content_base64": _base64(str(text))}
            for path, text in files.items()
            if text is not None
        ]
        prompt_config = {
            "system": "Answer in the sandbox.",
            "input_dir": f"{WORKDIR}/{relative}" if relative else WORKDIR,
            "output_dir": self.output_dir,
        }
        return {
            "prompt": str(self.row["problem_statement"]),
            "sandbox": {"image": image},
            "tools": {"profile": "reference"},
            "prompt_config": prompt_config,
            "input_files": input_files,
            "limits": {"max_steps": max_steps},
            "scorer": scorer_for_row(self.row),
            "ground_truth": self.row.get("ground_truth"),
            "unsubmitted": "answer_file",
        }


def _call_of(action: Any) -> tuple[str, dict[str, Any]]:
    """(function name, parameters) of the package's `Action`, rLLM's wrapper of one, or
    their dict forms (`{"function", "parameters"}`, `{"name", "arguments"}`)."""
    inner = getattr(action, "action", None)
    if inner is not None and not isinstance(action, dict):
        action = inner
    if hasattr(action, "function_name"):
        return str(action.function_name), dict(action.parameters or {})
    if isinstance(action, dict):
        name = action.get("function", action.get("name"))
        parameters = action.get("parameters", action.get("arguments")) or {}
        if isinstance(parameters, str):
            parameters = json.loads(parameters) if parameters.strip() else {}
        if isinstance(name, str) and isinstance(parameters, dict):
            return name, parameters
    raise TypeError(f"not an action (the package's Action or its dict): {action!r:.200}")


def _base64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
