"""`GET /v1/limits`: the submission limits a client can check before it sends a task.

The page refuses an oversize input file before uploading it, and a script can size its
batches, from the same numbers the server enforces (read from Settings, never copied).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from app.api.deps import Res, Tenant
from app.schemas.tasks import ErrorOut

router = APIRouter(prefix="/v1", tags=["limits"])

_ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": ErrorOut}}


class SubmissionLimitsOut(BaseModel):
    """What one task submission may hold; above any of these the server answers 413 or 422."""

    max_prompt_chars: int = Field(description="Longest prompt, in characters (422 above)")
    max_input_files: int = Field(description="Input files per task (422 above)")
    max_input_file_bytes: int = Field(description="Size of one input file, in bytes (413 above)")
    max_input_total_bytes: int = Field(
        description="Size of all of a task's input files together, in bytes (413 above)"
    )
    max_metadata_bytes: int = Field(description="Size of a task's `metadata` as JSON, in bytes")
    max_json_body_bytes: int = Field(description="Size of a JSON request body, in bytes (413)")
    max_multipart_body_bytes: int = Field(
        description="Size of a multipart request body, in bytes (413)"
    )
    max_max_steps: int = Field(description="The most `limits.max_steps` a task may ask for")
    max_timeout_s: int = Field(description="The most `limits.timeout_s` a task may ask for")
    max_command_timeout_s: int = Field(
        description="The most `limits.command_timeout_s` a task may ask for"
    )


@router.get("/limits", responses=_ERRORS)
async def get_limits(res: Res, _tenant: Tenant) -> SubmissionLimitsOut:
    """The server's submission limits (the same for every tenant today; a key is still needed,
    as for every /v1 route)."""
    s = res.settings
    return SubmissionLimitsOut(
        **{name: getattr(s, name) for name in SubmissionLimitsOut.model_fields},
    )
