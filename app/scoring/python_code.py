"""The `python` scorer: a user's `compute_score(agent_answer, ground_truth, **row)`.

User code is never run here, nor anywhere in the API or worker processes: this module only
holds the scorer's options and checks the code up-front (it parses and defines a top-level
`compute_score`), so a bad scorer is a 422 when the experiment is created rather than one
error per item. Running it is `app.sandbox.python_scorer.score.score_in_sandbox`, in a fresh
container, called by the worker's scoring loop because the scorer is `deferred`.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from app import defaults
from app.scoring.types import Score, ScorerError

if TYPE_CHECKING:
    from app.config import Settings

ENTRY_POINT = "compute_score"


@dataclass(frozen=True)
class PythonLimits:
    """The server's bounds on a `python` scorer (settings), with the defaults it gets."""

    code_max_bytes: int = defaults.PYTHON_SCORER_CODE_MAX_BYTES
    timeout_s: int = defaults.PYTHON_SCORER_TIMEOUT_S
    max_timeout_s: int = defaults.PYTHON_SCORER_MAX_TIMEOUT_S
    memory_mb: int = defaults.PYTHON_SCORER_MEMORY_MB
    max_memory_mb: int = defaults.PYTHON_SCORER_MAX_MEMORY_MB
    output_bytes: int = defaults.PYTHON_SCORER_OUTPUT_BYTES
    max_output_bytes: int = defaults.PYTHON_SCORER_MAX_OUTPUT_BYTES
    pids_limit: int = defaults.PYTHON_SCORER_PIDS_LIMIT
    scratch_mb: int = defaults.PYTHON_SCORER_SCRATCH_MB

    @classmethod
    def from_settings(cls, settings: Settings) -> PythonLimits:
        return cls(
            code_max_bytes=settings.experiment_scorer_code_max_bytes,
            timeout_s=settings.experiment_python_scorer_timeout_s,
            max_timeout_s=settings.experiment_python_scorer_max_timeout_s,
            memory_mb=settings.experiment_python_scorer_memory_mb,
            max_memory_mb=settings.experiment_python_scorer_max_memory_mb,
            output_bytes=settings.experiment_python_scorer_output_bytes,
            max_output_bytes=settings.experiment_python_scorer_max_output_bytes,
            pids_limit=settings.experiment_python_scorer_pids_limit,
            scratch_mb=settings.experiment_python_scorer_scratch_mb,
        )


@dataclass(frozen=True)
class PythonScorer:
    """User code and the limits of the one sandbox each answer is scored in."""

    code: str
    timeout_s: int = defaults.PYTHON_SCORER_TIMEOUT_S
    """Wall clock of one run of the code, from the interpreter's start to its result."""
    memory_mb: int = defaults.PYTHON_SCORER_MEMORY_MB
    output_bytes: int = defaults.PYTHON_SCORER_OUTPUT_BYTES
    """Per stream (stdout, stderr) kept for debugging: the head and the tail past it."""
    pids_limit: int = defaults.PYTHON_SCORER_PIDS_LIMIT
    """Set by the server, not by the spec: what a fork bomb runs into."""
    scratch_mb: int = defaults.PYTHON_SCORER_SCRATCH_MB
    """Size of each writable tmpfs (/tmp and the like): what a gigabyte write runs into."""

    kind: ClassVar[str] = "python"
    deferred: ClassVar[bool] = True
    """Too slow for the advancing transaction: the worker's scoring loop runs it."""
    needs_ground_truth: ClassVar[bool] = False
    """The user's code decides what it needs; a missing one arrives as None."""

    def score(self, answer: str | None, row: Mapping[str, Any]) -> Score:
        raise ScorerError(
            "the python scorer runs in a sandbox (app.sandbox.python_scorer.score), not in-process"
        )


def check_code(code: object, max_bytes: int) -> str:
    """The code, if it parses and defines a top-level `compute_score`; else ValueError."""
    if not isinstance(code, str) or not code.strip():
        raise ValueError(f"scorer 'python': option 'code' must be Python source, got {code!r:.80}")
    size = len(code.encode())
    if size > max_bytes:
        raise ValueError(f"scorer 'python': code is {size} bytes, more than {max_bytes}")
    try:
        tree = ast.parse(code, filename="scorer.py")
    except SyntaxError as exc:
        where = f"line {exc.lineno}" + (f", column {exc.offset}" if exc.offset else "")
        raise ValueError(f"scorer 'python': code does not parse ({where}): {exc.msg}") from exc
    except ValueError as exc:  # a NUL byte in the source
        raise ValueError(f"scorer 'python': code does not parse: {exc}") from exc
    except (RecursionError, MemoryError) as exc:  # `1+1+...` 60,000 times, `------...1`
        raise ValueError(
            f"scorer 'python': code is nested too deeply to parse ({type(exc).__name__})"
        ) from exc
    if not any(_defines_entry_point(node) for node in tree.body):
        raise ValueError(
            f"scorer 'python': code must define a top-level function {ENTRY_POINT}"
            "(agent_answer, ground_truth, **row)"
        )
    return code


def _defines_entry_point(node: ast.stmt) -> bool:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return node.name == ENTRY_POINT and isinstance(node, ast.FunctionDef)
    if isinstance(node, ast.Assign):  # compute_score = make_scorer(...)
        return any(isinstance(t, ast.Name) and t.id == ENTRY_POINT for t in node.targets)
    if isinstance(node, ast.ImportFrom):  # from somewhere import compute_score
        return any((alias.asname or alias.name) == ENTRY_POINT for alias in node.names)
    return False
