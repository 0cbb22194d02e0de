"""An experiment submitted as multipart: a `spec` part (the JSON body without `dataset`) and
a `dataset` file (JSONL, or JSON holding a list of rows or `{"rows": [...]}`).

Turns the parts into the same `ExperimentCreate` a JSON body is, so every later check, 422
and location (`dataset.rows.3.ground_truth`) is the inline one's and nothing is created on
error. The file is read in chunks from the spooled upload after its size is checked, so a
file past `SANDHIVE_EXPERIMENT_MAX_DATASET_BYTES` is a 413 without ever being held in memory,
and parsed in a thread.
Imported by the API; knows nothing of HTTP beyond a readable part.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol

from pydantic import ValidationError

from app.config import Settings
from app.domain.resolve import Problem, problem
from app.errors import InvalidInput, TooLarge
from app.schemas.experiments import MAX_ROWS, ExperimentCreate

CHUNK_BYTES = 64 * 2**10
MAX_LINE_PROBLEMS = 20
"""Bad JSONL lines named in one answer (the rest are summed up)."""
Format = Literal["jsonl", "json"]
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonlines")
JSONL_TYPES = ("application/jsonl", "application/x-ndjson", "application/x-jsonlines")
JSON_TYPES = ("application/json", "text/json")


class Part(Protocol):
    """A form part as Starlette's `UploadFile` is: its name, type, size and chunked read."""

    @property
    def filename(self) -> str | None: ...
    @property
    def content_type(self) -> str | None: ...
    @property
    def size(self) -> int | None: ...

    async def read(self, size: int = -1) -> bytes: ...


async def experiment_from_parts(
    spec: str | Part | None, dataset: str | Part | None, settings: Settings
) -> ExperimentCreate:
    """The submission the two parts make; InvalidInput (422) or TooLarge (413) otherwise.

    Parsing and validating tens of megabytes of rows takes seconds of CPU, so it runs in a
    thread: the API's event loop keeps serving streams and requests meanwhile.
    """
    data = await _spec(spec, settings)
    if dataset is None or isinstance(dataset, str):
        raise InvalidInput(
            "a multipart experiment needs a `dataset` file part (.jsonl or .json)",
            details=[problem(("dataset",), "a file part is required", "missing")],
        )
    whole = await read_file(dataset, settings.experiment_max_dataset_bytes)
    return await asyncio.to_thread(_submission, data, whole, _format(dataset))


def _submission(data: dict[str, Any], whole: bytes, kind: Format | None) -> ExperimentCreate:
    rows = parse_rows(whole, kind)
    try:
        return ExperimentCreate.model_validate({**data, "dataset": {"rows": rows}})
    except ValidationError as exc:
        details: list[Problem] = [
            problem(tuple(e["loc"]), e["msg"].removeprefix("Value error, "), e["type"])
            for e in exc.errors()
        ]
        raise InvalidInput(_summary(details), details) from exc


async def _spec(part: str | Part | None, settings: Settings) -> dict[str, Any]:
    if part is None:
        raise InvalidInput(
            "a multipart experiment needs a `spec` part: the JSON body without `dataset`",
            details=[problem(("spec",), "a `spec` part is required", "missing")],
        )
    raw = part if isinstance(part, str) else await _read_small(part, settings.max_json_body_bytes)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise _spec_refusal("not valid JSON") from exc
    if not isinstance(data, dict):
        raise _spec_refusal("must be a JSON object")
    if "dataset" in data:
        raise _spec_refusal("leave `dataset` out: the rows come in the `dataset` file part")
    return data


def _spec_refusal(msg: str) -> InvalidInput:
    return InvalidInput(f"the `spec` part: {msg}", details=[problem(("spec",), msg)])


async def _read_small(part: Part, limit: int) -> bytes:
    if (part.size or 0) > limit:
        raise TooLarge(f"the `spec` part is larger than {limit} bytes")
    refusal = TooLarge(f"the `spec` part is larger than {limit} bytes")
    return b"".join([chunk async for chunk in _chunks(part, limit, refusal)])


async def read_file(part: Part, limit: int) -> bytes:
    """The dataset file's bytes; TooLarge (413) past `limit`, declared or counted."""
    if (part.size or 0) > limit:
        raise _too_large(limit)
    return b"".join([chunk async for chunk in _chunks(part, limit, _too_large(limit))])


def parse_rows(whole: bytes, kind: Format | None) -> list[Any]:
    """The file's rows, in file order (each checked later as an inline row is).

    A file with no name or type to go by is one JSON document if it parses as a list or as
    `{"rows": [...]}`, else JSON Lines (a one-line JSONL file is also a JSON object).
    """
    if kind == "jsonl":
        return _jsonl_rows(whole)
    if kind == "json":
        return _json_rows(_document(whole))
    try:
        data = json.loads(whole)
    except (ValueError, RecursionError):
        return _jsonl_rows(whole)
    if isinstance(data, list) or (isinstance(data, dict) and isinstance(data.get("rows"), list)):
        return _json_rows(data)
    return _jsonl_rows(whole)


def _format(part: Part) -> Format | None:
    """From the file name first (browsers send JSONL as octet-stream), then the type."""
    name = (part.filename or "").lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(".json"):
        return "json"
    kind = (part.content_type or "").split(";")[0].strip().lower()
    if kind in JSONL_TYPES:
        return "jsonl"
    if kind in JSON_TYPES:
        return "json"
    return None


async def _chunks(part: Part, limit: int, refusal: TooLarge) -> AsyncIterator[bytes]:
    """The part in chunks, counted as they come: the declared size may be missing."""
    seen = 0
    while chunk := await part.read(CHUNK_BYTES):
        seen += len(chunk)
        if seen > limit:
            raise refusal
        yield chunk


def _too_large(limit: int) -> TooLarge:
    return TooLarge(
        f"the dataset file is larger than {limit} bytes (SANDHIVE_EXPERIMENT_MAX_DATASET_BYTES)"
    )


def _jsonl_rows(whole: bytes) -> list[Any]:
    """One JSON object per line; blank lines skipped; every bad line named by its number."""
    rows: list[Any] = []
    problems: list[Problem] = []
    bad = 0
    for number, line in enumerate(io.BytesIO(whole), 1):
        bad += _jsonl_line(number, line, rows, problems)
    if bad:
        more = f" (and {bad - 1} more bad lines)" if bad > 1 else ""
        raise InvalidInput(f"the dataset file: {problems[0]['msg']}{more}", details=problems)
    return _rows_in_range(rows)


def _jsonl_line(number: int, line: bytes, rows: list[Any], problems: list[Problem]) -> int:
    """Parse one line into `rows`; 1 if it is bad (recorded while under the cap), else 0."""
    if not line.strip():
        return 0
    msg: str | None = None
    try:
        row = json.loads(line)
    except (ValueError, RecursionError) as exc:
        msg = f"line {number}: not valid JSON ({_reason(exc)})"
    else:
        if isinstance(row, dict):
            rows.append(row)
            if len(rows) > MAX_ROWS:
                raise _too_many_rows()
            return 0
        msg = f"line {number}: a row must be a JSON object, got {type(row).__name__}"
    if len(problems) < MAX_LINE_PROBLEMS:
        problems.append(problem(("dataset", "line", number), msg, "json_invalid", line=number))
    return 1


def _document(whole: bytes) -> Any:
    try:
        return json.loads(whole)
    except (ValueError, RecursionError) as exc:
        msg = f"not valid JSON ({_reason(exc)})"
        raise InvalidInput(f"the dataset file: {msg}", [problem(("dataset",), msg)]) from exc


def _reason(exc: Exception) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)


def _json_rows(data: Any) -> list[Any]:
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        msg = 'a .json dataset holds a list of rows or {"rows": [...]}'
        raise InvalidInput(f"the dataset file: {msg}", [problem(("dataset",), msg)])
    return _rows_in_range(rows)


def _rows_in_range(rows: list[Any]) -> list[Any]:
    if not rows:
        msg = "the dataset file has no rows"
        raise InvalidInput(msg, [problem(("dataset", "rows"), msg, "too_short")])
    if len(rows) > MAX_ROWS:
        raise _too_many_rows()
    return rows


def _too_many_rows() -> InvalidInput:
    msg = f"more than {MAX_ROWS} rows"
    return InvalidInput(f"the dataset file: {msg}", [problem(("dataset", "rows"), msg, "too_many")])


def _summary(problems: list[Problem]) -> str:
    """The first problem, located, as a JSON body's 422 says it (+ how many more)."""
    first = problems[0]
    where = ".".join(map(str, first["loc"][1:]))
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{where}: {first['msg']}{more}"
