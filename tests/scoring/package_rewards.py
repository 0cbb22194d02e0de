"""The paper's package's own reward code, scoring answers given on stdin.

    PYTHONPATH=.package-lib .venv/bin/python tests/scoring/package_rewards.py < cases.json

`cases.json`: a JSON list of `[task, answer, row]` (the row with its `ground_truth`), as
the package's benchmark runner calls `compute_score(agent_answer, ground_truth, **row)`;
prints the JSON list of scores. Run by tests/scoring/test_package_reward_parity.py in a
process of its own: the package's modules come from `make reference-package`, its
`litellm` import (the model call, which none of this makes) is an empty module.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
import types


def main() -> None:
    sys.modules.setdefault("litellm", types.ModuleType("litellm"))
    cases = json.load(sys.stdin)
    scores = []
    with contextlib.redirect_stdout(sys.stderr):  # what the rewards print is not the result
        for task, answer, row in cases:
            reward = importlib.import_module(f"llm_in_sandbox.benchmark.{task}.reward")
            fields = {key: value for key, value in row.items() if key != "ground_truth"}
            scores.append(reward.compute_score(answer, row["ground_truth"], **fields))
    json.dump(scores, sys.stdout)


if __name__ == "__main__":
    main()
