"""A streamed command (`POST /v1/sandboxes/{id}/exec/stream`): what both clients share.

The server sends `output` events (`{"stream", "data"}`, base64 as the client asks) while
the command runs, then one `exit` event with its result, whose stdout and stderr are
empty: they were the output events; or, when something broke after the command was sent,
an `error` event in the API's error shape (CommandStreamError). The result handed to the
caller carries the whole output again, as `Sandbox.exec` gives it.
"""

from __future__ import annotations

import json
from typing import Any

from sandhive_client import errors
from sandhive_client._sse import Frame
from sandhive_client.models import ExecOutput, ExecResult, decode_output


class StreamedExec:
    """Reads the frames of one command's stream into output pieces and its result."""

    def __init__(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        self.result: ExecResult | None = None
        self._out = {"stdout": bytearray(), "stderr": bytearray()}

    def accept(self, frame: Frame) -> ExecOutput | ExecResult | None:
        """The frame's piece of output or the command's result; None for any other event."""
        if frame.event == "output":
            data = _object(frame)
            piece = ExecOutput(
                stream=data["stream"], data=decode_output(str(data["data"]), "base64")
            )
            self._out[piece.stream] += piece.data
            return piece
        if frame.event == "exit":
            result = ExecResult.from_wire(_object(frame))
            self.result = result.model_copy(
                update={"stdout": bytes(self._out["stdout"]), "stderr": bytes(self._out["stderr"])}
            )
            return self.result
        if frame.event == "error":  # the contract's error shape, the stream's last event
            error = _object(frame)
            raise errors.CommandStreamError(
                self.sandbox_id,
                str(error.get("code", "error")),
                str(error.get("message", frame.data[:500])),
                error.get("details"),
            )
        return None

    def ended_early(self) -> errors.ConnectionFailed:
        """What to raise when the stream ended without the command's result."""
        return errors.ConnectionFailed(
            f"the command stream of {self.sandbox_id} ended before the command's exit "
            "(the command may still be running: see Sandbox.commands())"
        )


def _object(frame: Frame) -> dict[str, Any]:
    data = json.loads(frame.data)
    if not isinstance(data, dict):
        raise errors.SandhiveError(f"unexpected {frame.event} event: {frame.data[:200]}")
    return data
