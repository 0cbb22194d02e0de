"""The `verifier` scorer: an item's score is its task's verifier reward (Harbor's tests).

Unlike every other scorer it reads no answer: the reward was found in the item's own
sandbox once its agent ended (`app.runner.verifier`) and stored on the task as its
`verification`; this turns that into the item's score, or into why there is none. A
reward the service could not produce (Docker failed) is an infrastructure failure, never
a 0. A script that wrote no usable reward scores 0, its reason in `detail.message`: it ran
in the sandbox the agent left, so the agent may have caused it (filled the sandbox, broke
what the script needs), and an error left out of the mean would let an agent dodge its 0
that way. A reward outside [0, 1] is the task's own scale, a `scorer` error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.scoring.types import Score, ScorerError, ScoringFailed

KIND = "verifier"


@dataclass(frozen=True)
class VerifierScorer:
    kind: str = KIND
    needs_ground_truth: bool = False
    from_task: bool = True
    """Scored from the item's task (`verdict`), never from an answer."""

    def score(self, answer: str | None, row: Mapping[str, Any]) -> Score:
        raise ScorerError("a verifier's reward comes from the item's own sandbox, not an answer")

    def validate_row(self, row: Mapping[str, Any]) -> None:
        """The row's `verifier`: its files by path under /tests (text), optionally a command
        and a timeout; ValueError saying what is wrong."""
        spec = row.get("verifier")
        if not isinstance(spec, Mapping):
            raise ValueError("scorer 'verifier' needs the row's verifier: {files, command?}")
        files = spec.get("files")
        if not isinstance(files, Mapping) or not files:
            raise ValueError("verifier.files must map paths under /tests to their text")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise ValueError("verifier.files must map paths under /tests to their text")
        unknown = sorted(set(spec) - {"files", "command", "timeout_s"})
        if unknown:
            raise ValueError(f"verifier: unknown option {unknown[0]!r}")


def verdict(verification: Mapping[str, Any] | None) -> Score:
    """The item's score from its task's `verification`; raises ScorerError (ScoringFailed
    when the service failed to run it) when there is none to give."""
    if verification is None:
        raise ScoringFailed("the task's verifier did not run")
    detail = dict(verification)
    if verification.get("infrastructure"):
        raise ScoringFailed(str(verification.get("error") or "the verifier could not run"), detail)
    reward = verification.get("reward")
    if reward is None:  # in the agent's own sandbox: the agent may have caused it
        why = str(verification.get("error") or "no reward")
        return Score(0.0, {**detail, "message": f"verifier: {why}; scored 0"})
    if not 0.0 <= float(reward) <= 1.0:
        raise ScorerError(f"verifier: reward {reward} is outside [0, 1]", detail)
    return Score(float(reward), detail)
