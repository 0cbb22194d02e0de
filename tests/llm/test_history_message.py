"""The assistant message sent back on later turns (`app.llm.openai.history_message`)."""

from __future__ import annotations

from app.llm.openai import history_message


def test_a_turn_with_neither_text_nor_calls_goes_back_as_empty_text() -> None:
    """llama.cpp refuses an assistant message without `content` or `tool_calls` (HTTP 400);
    its stream of a call cut off by max_tokens has neither (tests/real_llm)."""
    assert history_message({"role": "assistant", "content": None}) == {
        "role": "assistant",
        "content": "",
    }
    assert history_message({"content": None, "tool_calls": []}) == {
        "role": "assistant",
        "content": "",
    }


def test_text_and_calls_are_kept_as_they_came() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "submit", "arguments": "{}"}}
    assert history_message({"content": None, "tool_calls": [call]}) == {
        "role": "assistant",
        "tool_calls": [call],
    }
    assert history_message({"role": "assistant", "content": "hi", "refusal": None}) == {
        "role": "assistant",
        "content": "hi",
    }
