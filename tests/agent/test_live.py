"""app.agent.live: live-only progress coalesced, decoded and handed to the sink in order."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from app.agent import live
from app.agent.types import Step, ToolCall
from app.sandbox import DockerSandbox


class RecordingSink:
    """An EventSink that keeps the live events it is given (and can be made to fail)."""

    def __init__(self, fail: bool = False) -> None:
        self.live_events: list[tuple[str, dict[str, object]]] = []
        self.fail = fail

    async def step_started(self, index: int) -> None:
        return None

    async def step_completed(self, step: Step, next_index: int | None = None) -> None:
        return None

    async def live(self, kind: str, data: Mapping[str, object]) -> None:
        if self.fail:
            raise ConnectionError("redis is down")
        self.live_events.append((kind, dict(data)))


async def test_many_fragments_become_few_ordered_events() -> None:
    sink = RecordingSink()
    async with live.model_deltas(sink, 3) as on_delta:
        for n in range(200):
            await on_delta("reasoning" if n < 100 else "text", f"{n},")
    kinds = [kind for kind, _ in sink.live_events]
    assert set(kinds) == {"llm.delta"}
    assert len(sink.live_events) < 10  # coalesced, not 200 events
    assert all(data["index"] == 3 for _, data in sink.live_events)
    reasoning = "".join(str(d.get("reasoning", "")) for _, d in sink.live_events)
    text = "".join(str(d.get("text", "")) for _, d in sink.live_events)
    assert reasoning == "".join(f"{n}," for n in range(100))
    assert text == "".join(f"{n}," for n in range(100, 200))


async def test_a_pause_flushes_without_waiting_for_the_end() -> None:
    sink = RecordingSink()
    async with live.model_deltas(sink, 0) as on_delta:
        await on_delta("text", "first")
        await asyncio.sleep(live.FLUSH_S * 4)
        assert sink.live_events == [("llm.delta", {"index": 0, "text": "first"})]
        await on_delta("text", "second")
    assert [data["text"] for _, data in sink.live_events] == ["first", "second"]


async def test_a_failing_sink_loses_live_events_but_never_raises() -> None:
    sink = RecordingSink(fail=True)
    call = ToolCall(id="c", name="execute_bash", arguments={"command": "true"})
    async with live.tool_call(sink, 0, call) as on_output:
        await on_output("stdout", b"lost\n")
    assert sink.live_events == []


async def test_output_past_the_budget_is_cut_with_a_note() -> None:
    sink = RecordingSink()
    async with live.command_output(sink, 1) as on_output:
        await on_output("stdout", b"x" * (live.MAX_LIVE_CHARS + 10))
        await on_output("stdout", b"more")
    chunks = "".join(str(data["chunk"]) for _, data in sink.live_events)
    assert chunks == "x" * live.MAX_LIVE_CHARS + live.TRUNCATED


@pytest.mark.asyncio(loop_scope="module")
async def test_command_output_streams_from_the_sandbox_with_characters_whole(
    box: DockerSandbox,
) -> None:
    sink = RecordingSink()
    call = ToolCall(id="c", name="execute_bash", arguments={"command": "..."})
    # ✓ is e2 9c 93: its bytes leave the sandbox in two writes, a moment apart.
    script = r"printf 'a\xe2\x9c'; sleep 0.8; printf '\x93b\n'; echo oops >&2"
    async with live.tool_call(sink, 5, call) as on_output:
        result = await box.exec(["bash", "-c", script], on_output=on_output)
    assert result.exit_code == 0
    assert sink.live_events[0] == (
        "tool.started",
        {"index": 5, "tool": "execute_bash", "arguments": {"command": "..."}},
    )
    outputs = [data for kind, data in sink.live_events if kind == "tool.output"]
    stdout = [str(d["chunk"]) for d in outputs if d["stream"] == "stdout"]
    assert stdout == ["a", "✓b\n"]  # two flushes; the split character came out whole
    assert [d["chunk"] for d in outputs if d["stream"] == "stderr"] == ["oops\n"]
