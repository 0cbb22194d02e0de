"""The canned task of `sandhive demo` (also served by the compose test stack's `llm`)."""

from __future__ import annotations

from app.scripted.script import Script, Turn

DEMO_MODEL = "scripted-demo"
DEMO_ANSWER = "16796"
DEMO_PROMPT = (
    "Scripted demo: compute the 10th Catalan number with Python and write it to "
    "/testbed/output/answer.txt."
)
DEMO_SCRIPT = Script(
    turns=(
        Turn(
            tool="execute_bash",
            arguments={"command": "python3 -c 'from math import comb; print(comb(20, 10) // 11)'"},
            content="(Scripted demo, not a real model.) Computing the 10th Catalan number "
            "with Python in the sandbox.",
        ),
        Turn(
            tool="str_replace_editor",
            arguments={
                "command": "create",
                "path": "/testbed/output/answer.txt",
                "file_text": DEMO_ANSWER,
            },
            content="(Scripted demo.) Python printed 16796; writing it to the answer file.",
            expect=DEMO_ANSWER,
        ),
        Turn(
            tool="submit",
            arguments={},
            content="(Scripted demo.) The answer is in /testbed/output/answer.txt; submitting.",
        ),
    )
)
"""A canned task for `sandhive demo`: compute in the sandbox, write the answer, submit."""
