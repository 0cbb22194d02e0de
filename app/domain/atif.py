"""A rollout as ATIF: Harbor's Agent Trajectory Interchange Format, v1.7.

A leaf module (stdlib only). ATIF is what Harbor, Phoenix and NVIDIA's toolkits read: a
root (`schema_version`, `session_id`, `agent`, `steps`, `final_metrics`, `extra`) whose
steps are the `user` prompt, then one `agent` step per model call with its tool call and
the tool's observation as that call's result. The input is a rollout line as the JSONL
export builds it (`app.services.rollouts.export.rollout_line`: turns, captured messages and
token ids) with the task's prompt and the steps' own timing and token counts, so a captured
rollout carries its token ids and logprobs into ATIF's per-step `metrics` and an uncaptured
one its counts alone. Harbor's own models validate the result (tests/services/test_atif.py
runs them from a Python 3.13 root filesystem, as Harbor needs).

Keys this module does not fill are left out rather than sent as null: Harbor's models
forbid unknown keys, not absent ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

SCHEMA_VERSION = "ATIF-v1.7"
AGENT_NAME = "sandhive"


def atif_trajectory(
    line: Mapping[str, Any],
    prompt: str,
    steps: Sequence[Mapping[str, Any]],
    *,
    agent_version: str,
    worker_attempt: int,
) -> dict[str, Any]:
    """The ATIF trajectory of one rollout: `line` from the export, `steps` the stored rows'
    columns (`started_at`, `llm_ms`, `prompt_tokens`, `completion_tokens`) in step order, of
    the task's `worker_attempt`."""
    model = line.get("model")
    agent: dict[str, Any] = {"name": AGENT_NAME, "version": agent_version}
    if model:
        agent["model_name"] = model
    if line.get("tools"):
        agent["tool_definitions"] = list(line["tools"])
    out_steps = _opening(line, prompt)
    for turn, step in zip(line.get("turns") or [], steps, strict=False):
        out_steps.append(_agent_step(len(out_steps) + 1, turn, step))
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": line["task_id"],
        "agent": agent,
        "steps": out_steps,
        "final_metrics": {
            "total_prompt_tokens": sum(int(s.get("prompt_tokens") or 0) for s in steps),
            "total_completion_tokens": sum(int(s.get("completion_tokens") or 0) for s in steps),
            "total_steps": len(out_steps),
        },
        "extra": {
            "worker_attempt": worker_attempt,
            **{
                key: line.get(key)
                for key in (
                    "task_id",
                    "experiment_id",
                    "row_id",
                    "arm",
                    "attempt",
                    "status",
                    "finish_reason",
                    "error",
                    "infrastructure_failure",
                    "answer",
                    "reward",
                )
            },
        },
    }


def _opening(line: Mapping[str, Any], prompt: str) -> list[dict[str, Any]]:
    """The system prompt when the rollout was captured (the request's first message), then
    the task's prompt as the user's step."""
    out: list[dict[str, Any]] = []
    messages = line.get("messages") or []
    if messages and messages[0].get("role") == "system":
        out.append({"step_id": 1, "source": "system", "message": _text(messages[0])})
    out.append({"step_id": len(out) + 1, "source": "user", "message": prompt})
    return out


def _agent_step(step_id: int, turn: Mapping[str, Any], step: Mapping[str, Any]) -> dict[str, Any]:
    """One model call: its text, reasoning, tool call, the tool's output, and its metrics."""
    out: dict[str, Any] = {
        "step_id": step_id,
        "source": "agent",
        "message": turn.get("thought") or "",
        "llm_call_count": 1,
    }
    started = step.get("started_at")
    if isinstance(started, datetime):
        out["timestamp"] = started.isoformat()
    if turn.get("reasoning"):
        out["reasoning_content"] = turn["reasoning"]
    call = turn.get("tool_call")
    call_id = f"call_{turn['index']}"
    if call is not None:
        arguments = call.get("arguments")
        out["tool_calls"] = [
            {
                "tool_call_id": call_id,
                "function_name": call.get("tool", ""),
                "arguments": arguments if isinstance(arguments, dict) else {"raw": arguments},
            }
        ]
    if call is not None or turn.get("observation"):
        result: dict[str, Any] = {"content": turn.get("observation") or ""}
        if call is not None:
            result["source_call_id"] = call_id
        out["observation"] = {"results": [result]}
    if turn.get("interrupted"):  # why the step was cut short (a failed model call, a cancel)
        out["extra"] = {"interrupted": turn["interrupted"]}
    out["metrics"] = _metrics(turn, step)
    return out


def _metrics(turn: Mapping[str, Any], step: Mapping[str, Any]) -> dict[str, Any]:
    """Token counts always; ids and logprobs when the call was captured."""
    out: dict[str, Any] = {
        "prompt_tokens": int(step.get("prompt_tokens") or 0),
        "completion_tokens": int(step.get("completion_tokens") or 0),
    }
    for key in ("prompt_token_ids", "completion_token_ids", "logprobs"):
        if turn.get(key) is not None:
            out[key] = list(turn[key])
    out["extra"] = {"llm_ms": int(step.get("llm_ms") or 0)}
    if turn.get("finish_reason"):
        out["extra"]["finish_reason"] = turn["finish_reason"]
    return out


def _text(message: Mapping[str, Any]) -> str:
    """A chat message's text (a list of parts joined, as OpenAI's text parts are)."""
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")
