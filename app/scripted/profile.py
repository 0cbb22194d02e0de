"""The built-in `scripted` LLM profile (`SANDHIVE_SCRIPTED_PROFILE=true`): its scripts and server.

`app.config` declares the profile (name, models) so the API can offer and check it;
this module plays it. `serving` is entered by the processes that call models, the
worker and `sandhive run` (`app.cli.main`), and by tests: it starts a `ScriptedLLMServer`
on a loopback port for the process's lifetime and points the profile at it, so the
profile needs no URL of the API and no process of its own. Models: `demo` (the
three steps of `sandhive demo`) and `tour` (many steps: a failing command, an edit,
output printed over a few seconds, a plot saved as a PNG artifact).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from app.config import SCRIPTED_MODELS, Settings
from app.scripted.demo import DEMO_SCRIPT
from app.scripted.script import Script, Turn
from app.scripted.server import ScriptedLLMServer

TOUR_MODEL = "tour"
TOUR_ANSWER = "6171"
TOUR_IMAGE = "collatz.png"
_LABEL = "(Scripted tour, not a real model.) "
_PAUSE_S = 0.1
"""Between the streamed pieces of each answer, so the page shows the text being written."""

_COLLATZ = '''\
"""Longest Collatz chain of a start below LIMIT (scripted tour)."""
import time

LIMIT = 10_000


def steps(n):
    count = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        count += 1
    return cuont


best, lengths = (0, 0), []
for start in range(1, LIMIT):
    length = steps(start)
    lengths.append(length)
    if length > best[1]:
        best = (start, length)
    if start % 2000 == 0:
        print(f"checked {start:>5} starts; longest so far {best[0]} ({best[1]} steps)", flush=True)
        time.sleep(1)
print(f"longest chain below {LIMIT}: {best[0]} with {best[1]} steps")
with open("/testbed/lengths.txt", "w") as f:
    f.write("\\n".join(map(str, lengths)))
'''

_PLOT = f'''\
"""Plot the chain lengths (scripted tour)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

lengths = [int(x) for x in open("/testbed/lengths.txt").read().split()]
fig, ax = plt.subplots(figsize=(8, 4.5))
ax.scatter(range(1, len(lengths) + 1), lengths, s=1)
ax.set(title="Collatz: steps to reach 1", xlabel="start", ylabel="steps")
fig.savefig("/testbed/output/{TOUR_IMAGE}", dpi=100)
print("saved /testbed/output/{TOUR_IMAGE}")
'''


def _turn(
    tool: str,
    arguments: dict[str, str],
    content: str,
    *,
    reasoning: str = "",
    expect: str | None = None,
) -> Turn:
    """A labelled turn, streamed slowly enough to watch."""
    return Turn(
        tool=tool,
        arguments=arguments,
        content=_LABEL + content,
        reasoning=reasoning,
        expect=expect,
        stream_delay_s=_PAUSE_S,
    )


TOUR_SCRIPT = Script(
    turns=(
        _turn(
            "execute_bash",
            {"command": "ls -la /testbed && python3 --version"},
            "Looking around the sandbox first.",
            reasoning="The task: the longest Collatz chain below 10000, with a plot.",
        ),
        _turn(
            "str_replace_editor",
            {"command": "create", "path": "/testbed/collatz.py", "file_text": _COLLATZ},
            "Writing a program that counts the steps of every start below 10000.",
        ),
        _turn(
            "execute_bash",
            {"command": "python3 /testbed/collatz.py"},
            "Running it.",
        ),
        _turn(
            "str_replace_editor",
            {
                "command": "str_replace",
                "path": "/testbed/collatz.py",
                "old_str": "    return cuont",
                "new_str": "    return count",
            },
            "A typo: `cuont`. Fixing it.",
            reasoning="NameError: the variable is `count`.",
            expect="NameError",
        ),
        _turn(
            "execute_bash",
            {"command": "python3 /testbed/collatz.py"},
            "Running it again; it reports its progress as it goes.",
        ),
        _turn(
            "str_replace_editor",
            {"command": "create", "path": "/testbed/plot.py", "file_text": _PLOT},
            f"The longest chain starts at {TOUR_ANSWER}. Now a plot of every chain's length.",
            expect=f"{TOUR_ANSWER} with 261 steps",
        ),
        _turn(
            "execute_bash",
            {"command": "python3 /testbed/plot.py"},
            "Drawing it with matplotlib.",
        ),
        _turn(
            "str_replace_editor",
            {"command": "create", "path": "/testbed/output/answer.txt", "file_text": TOUR_ANSWER},
            "Writing the answer.",
            expect=f"saved /testbed/output/{TOUR_IMAGE}",
        ),
        _turn("submit", {}, f"Done: the answer is {TOUR_ANSWER}, the plot is {TOUR_IMAGE}."),
    )
)
"""A many-step scripted task: fail, edit, rerun with live output, plot, answer, submit."""

SCRIPTS: dict[str, Script] = {"demo": DEMO_SCRIPT, TOUR_MODEL: TOUR_SCRIPT}
assert tuple(SCRIPTS) == SCRIPTED_MODELS, "app.config.SCRIPTED_MODELS names these scripts"


@contextmanager
def serving(settings: Settings) -> Iterator[Settings]:
    """`settings` with the `scripted` profile served in-process while inside (when it is on
    and no `scripted_base_url` names a server already)."""
    if not settings.scripted_profile or settings.scripted_base_url:
        yield settings
        return
    with ScriptedLLMServer(SCRIPTS) as server:
        yield settings.model_copy(update={"scripted_base_url": server.base_url})
