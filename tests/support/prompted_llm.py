"""A scripted model whose first turn depends on the prompt and on how often it was asked.

`ScriptBook` picks a turn by position alone, so every task of one model plays the same
answer. An evaluation test needs answers that differ by row (the prompt) and by attempt
(the same prompt asked again, like a model sampled at a temperature): `PromptedBook` finds
the row's tag in the request's messages and plays, for the n-th task that asked about that
row, the n-th script planned for it. Which attempt arrives first is up to the scheduler,
so a test can know each row's multiset of answers (hence every mean, pass@k and paired
comparison) but not which attempt got which. Everything else (tools, failures, counters)
is the scripted server's own behaviour.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from app.scripted import Script, ScriptedLLMServer
from app.scripted.script import ScriptBook, message_text


def row_tag(row_id: str) -> str:
    """What a row's problem statement carries so the model can tell which row it is asked."""
    return f"[row:{row_id}]"


class PromptedBook(ScriptBook):
    """Per model and row, the scripts its successive tasks play (the last one repeats)."""

    def __init__(self) -> None:
        super().__init__()
        self._plan_lock = threading.Lock()
        self._plans: dict[str, dict[str, Sequence[Script]]] = {}
        self._asked: Counter[tuple[str, str]] = Counter()

    def plan(self, model: str, by_row: Mapping[str, Sequence[Script]]) -> None:
        """Register a model's scripts by row id.

        A task's later requests cannot tell which of the row's scripts its first turn got,
        so every script of a model must play the same turns after the first.
        """
        scripts = [script for row in by_row.values() for script in row]
        assert scripts, "a plan needs scripts"
        later = list(scripts[0].turns[1:])
        assert all(list(s.turns[1:]) == later for s in scripts), (
            f"{model}: scripts differ after their first turn"
        )
        with self._plan_lock:
            self._plans[model] = {row: list(row_scripts) for row, row_scripts in by_row.items()}
        self.add_script(model, scripts[0])  # for `models()` and unknown-row requests

    def asked(self, model: str, row_id: str) -> int:
        """How many tasks of this model asked about this row (first turns seen)."""
        with self._plan_lock:
            return self._asked[(model, row_id)]

    def receive(
        self, model: str, body: dict[str, Any], headers: Mapping[str, str]
    ) -> tuple[Script | None, int]:
        script, count = super().receive(model, body, headers)
        with self._plan_lock:
            plan = self._plans.get(model)
            if plan is None:
                return script, count
            messages = body.get("messages")
            messages = messages if isinstance(messages, list) else []
            text = "\n".join(
                message_text(m.get("content")) for m in messages if isinstance(m, dict)
            )
            row = next((row for row in plan if row_tag(row) in text), None)
            if row is None:
                self.fail(f"{model}: no planned row's tag in the request")
                return script, count
            first_turn = not any(
                isinstance(m, dict) and m.get("role") == "assistant" for m in messages
            )
            asked = self._asked[(model, row)]
            if first_turn:
                self._asked[(model, row)] = asked + 1
            else:
                asked -= 1  # any of the row's scripts: they agree past the first turn
            scripts = plan[row]
            return scripts[min(max(asked, 0), len(scripts) - 1)], count


class PromptedLLMServer(ScriptedLLMServer):
    """The scripted model server over a `PromptedBook` (`server.book.plan(...)`)."""

    book: PromptedBook

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host=host, port=port)
        self.book = PromptedBook()

    def __enter__(self) -> PromptedLLMServer:
        self.start()
        return self
