"""A server that dies mid-answer, as llama-server does when killed (tests/real_llm has the
real one): the error says so, also after the retry was refused at connect."""

from __future__ import annotations

import httpx
import pytest

from app.errors import LLMError
from app.llm.transport import Endpoint, Failure, transport_failure, with_retries


def test_a_connection_closed_mid_answer_is_named_and_retried() -> None:
    failure = transport_failure(httpx.RemoteProtocolError("incomplete chunked read"))
    assert failure.retryable
    assert failure.description.startswith("the server closed the connection mid-answer")


async def test_the_error_keeps_the_first_failure_when_the_last_differs() -> None:
    failures = iter(
        [
            transport_failure(httpx.RemoteProtocolError("incomplete chunked read")),
            transport_failure(httpx.ConnectError("All connection attempts failed")),
        ]
    )

    async def attempt() -> Failure:
        return next(failures)

    with pytest.raises(LLMError) as raised:
        await with_retries(
            attempt,
            endpoint=Endpoint("http://127.0.0.1:9/v1/chat/completions", ""),
            max_retries=1,
            backoff_s=0,
            recover=lambda _: False,
        )
    message = str(raised.value)
    assert "unreachable" in message
    assert "first attempt: the server closed the connection mid-answer" in message
    assert "after 2 attempt(s)" in message
