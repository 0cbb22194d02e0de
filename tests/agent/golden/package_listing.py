"""The paper's package's own answer to `str_replace_editor view /testbed`, on this Docker host.

    PYTHONPATH=.package-lib .venv/bin/python tests/agent/golden/package_listing.py IMAGE

Prints one JSON line: the observations of the package's `DockerRuntime` (llm-in-sandbox
0.2.0; its `setup_env` makes input/, output/ and .git, as in every run of its) and its
`Agent._execute_action` for the calls of `CALLS`, then `view /testbed`. The listing's order
is the Docker host's file system's (ext4: hash order, seeded per file system), so it cannot
be recorded once: tests/agent/test_reference_listing_order.py runs this beside Sandhive.

Only the package's tool and runtime code runs. Its agent module imports `litellm` for the
model call, which none of this makes: an empty module stands in, so `make reference-package`
installs the package without its dependencies (not litellm's tree) and docker-py with its own.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any

CALLS: list[tuple[str, dict[str, Any]]] = [
    ("str_replace_editor", {"command": "create", "path": f"/testbed/{path}", "file_text": text})
    for path, text in (("pkg/sub/mod.py", "x = 1"), ("big.py", "y = 2"), ("empty.py", ""))
] + [("execute_bash", {"command": "mkdir -p data docs && touch README.rst a.py z.py notes.txt"})]
"""What a model did before looking: the golden session's files and a few more."""

VIEW: dict[str, Any] = {"command": "view", "path": "/testbed"}


def main(image: str, label: str) -> None:
    sys.modules.setdefault("litellm", types.ModuleType("litellm"))
    from llm_in_sandbox import Agent, AgentArgs, DockerRuntime
    from llm_in_sandbox.action import Action

    runtime = DockerRuntime(
        docker_image=image, logger=False, network_mode="none", labels={"sandhive.test": label}
    )
    try:
        agent = Agent(AgentArgs(system_prompt="", instance_prompt="", llm_name="openai/x"))
        seen = [agent._execute_action(Action(tool, args), runtime) for tool, args in CALLS]
        view = agent._execute_action(Action("str_replace_editor", VIEW), runtime)
        print(json.dumps({"calls": seen, "view": view}), flush=True)
    finally:
        runtime.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "package-listing")
