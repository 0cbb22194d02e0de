"""Record `reference-replays.jsonl`: the package's own tool answers for the replay cases.

Run with the package's interpreter, never Sandhive's (bench/package_setup.sh makes one):

    .bench-venv/bin/python tests/agent/golden/record_replays.py [IMAGE] | grep '^{' > \
        tests/agent/golden/reference-replays.jsonl

It starts the package's `DockerRuntime` (llm-in-sandbox 0.2.0; network off) on IMAGE
(default sandhive-sandbox:latest: the package's image cannot be pulled here; the tools'
texts do not depend on it) and sends each call through the package's own
`Agent._execute_action`, in order, in that one container, as its loop would. Each line is
the call and the observation exactly as returned, before the loop's "Steps Remaining"
suffix. The timeout case waits the package's fixed 120 s.
"""

from __future__ import annotations

import json
import sys
from typing import Any

SETUP = (
    "printf 'a\\nb\\n' > /testbed/two.py; echo hi > /testbed/notes.txt; "
    "printf 'x = 1\\nx = 1\\n' > /testbed/dup.py; : > /testbed/void.py; "
    "printf 'a\\nb\\n' > /testbed/ins.py; mkdir -p '/testbed/my dir'"
)
"""Files the editor cases work on, made before them (not recorded)."""

CASES: list[tuple[str, Any]] = [
    ("execute_bash", {"command": ""}),
    ("execute_bash", {}),
    ("execute_bash", {"command": "echo partial; echo err >&2; sleep 130"}),
    ("execute_bash", {"command": "echo done; exit 124"}),
    (
        "execute_bash",
        {
            "command": "for i in $(seq 1 81); do echo o$i; done; "
            "for i in $(seq 1 100); do echo e$i >&2; done"
        },
    ),
    ("execute_bash", {"command": "seq 1 80"}),
    ("execute_bash", {"command": "head -c 200000 /dev/zero | tr '\\0' x"}),
    (
        "execute_bash",
        {
            "command": "printf '\\033[1;31mred\\033[0m\\r\\n50%%\\r100%%\\n\\033[2Kline\\n'; "
            "printf '\\033[33mw\\r\\n' >&2"
        },
    ),
    ("execute_bash", {"command": "echo out; printf '  \\n\\n' >&2; exit 3"}),
    ("execute_bash", {"command": "printf '   \\n'"}),
    ("execute_bash", {"command": "printf '\\xe2\\x9c ok \\xc3\\n'; printf '\\xff\\n' >&2"}),
    ("execute_bash", {"command": "printf 'a\\000b\\001c\\n'"}),
    ("python", {"code": "1"}),
    ("str_replace_editor", {"command": "view", "path": "/testbed/two.py", "view_range": [0, 2]}),
    ("str_replace_editor", {"command": "view", "path": "/testbed/two.py", "view_range": [4, -1]}),
    ("str_replace_editor", {"command": "view", "path": "/testbed/notes.txt"}),
    ("str_replace_editor", {"command": "str_replace", "path": "/testbed/dup.py", "old_str": "y"}),
    (
        "str_replace_editor",
        {"command": "str_replace", "path": "/testbed/dup.py", "old_str": "x = 1"},
    ),
    ("str_replace_editor", {"command": "str_replace", "path": "/testbed/void.py", "old_str": "a"}),
    (
        "str_replace_editor",
        {"command": "str_replace", "path": "/testbed/absent.py", "old_str": "a = 1"},
    ),
    (
        "str_replace_editor",
        {"command": "insert", "path": "/testbed/ins.py", "insert_line": 5, "new_str": "c"},
    ),
    (
        "str_replace_editor",
        {"command": "insert", "path": "/testbed/ins.py", "insert_line": -1, "new_str": "c"},
    ),
    (
        "str_replace_editor",
        {"command": "insert", "path": "/testbed/ghost.py", "insert_line": 0, "new_str": "x"},
    ),
    ("execute_bash", {"command": "cat /testbed/ghost.py"}),
    ("str_replace_editor", {"command": "create", "path": "/testbed/input", "file_text": "x"}),
    ("str_replace_editor", {"command": "view", "path": "/nope/x.py"}),
    ("str_replace_editor", {"command": "undo_edit", "path": "/testbed/two.py"}),
    ("str_replace_editor", {"command": "view", "path": "/testbed/my dir"}),
    ("str_replace_editor", ["view", "/testbed"]),
    ("execute_bash", ["ls"]),
]
"""The calls, in order; a list stands for arguments that decode to a JSON array."""


def main(image: str) -> None:
    from llm_in_sandbox import Agent, AgentArgs, DockerRuntime
    from llm_in_sandbox.action import Action

    runtime = DockerRuntime(docker_image=image, logger=False, network_mode="none")
    try:
        runtime.run(SETUP)
        agent = Agent(AgentArgs(system_prompt="", instance_prompt="", llm_name="openai/x"))
        header = {"kind": "source", "package": "llm-in-sandbox 0.2.0", "image": image}
        header["setup"] = SETUP
        print(json.dumps(header))
        for index, (tool, arguments) in enumerate(CASES):
            observation = agent._execute_action(Action(tool, arguments), runtime)
            line = {"kind": "step", "index": index, "tool": tool, "arguments": arguments}
            print(json.dumps({**line, "observation": observation}), flush=True)
    # The package's logger and console print to stdout too: keep only the JSON lines
    # (`grep '^{'`) when saving.
    finally:
        runtime.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sandhive-sandbox:latest")
