"""POST /v1/experiments as multipart/form-data: a `spec` part and a `dataset` file (.jsonl or
.json), checked exactly as inline rows are, with nothing created on any refusal."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from app.api.app import create_app
from app.config import Settings
from app.db.engine import Sessions
from app.errors import TooLarge
from app.services.experiments import upload as experiment_upload
from tests.api.conftest import assert_error, serve
from tests.support.experiments import counts, experiment

ROWS: list[dict[str, Any]] = [
    {"id": "q1", "problem_statement": "What is 1 + 1?", "ground_truth": "2"},
    {"id": 7, "problem_statement": "Sum x.", "ground_truth": "3", "input_files": {"d.csv": "x\n3"}},
    {"id": "q3", "problem_statement": "What is 3 + 3?", "ground_truth": "6", "domain": "arith"},
]


def spec(**overrides: Any) -> str:
    body = experiment(**overrides)
    del body["dataset"]
    return json.dumps(body)


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


async def upload(
    client: Any, dataset: tuple[str, bytes, str] | None, spec_text: str | None = None
) -> Any:
    data = {} if spec_text is None else {"spec": spec_text}
    files = [("dataset", dataset)] if dataset is not None else [("other", ("x.txt", b"x"))]
    return await client.post("/v1/experiments", data=data, files=files)


async def items_of(client: Any, exp_id: str) -> list[tuple[Any, ...]]:
    items = (await client.get(f"/v1/experiments/{exp_id}/items")).json()["items"]
    return [(i["row_id"], i["arm"], i["attempt"]) for i in items]


@pytest.mark.parametrize(
    "dataset",
    [
        ("rows.jsonl", b"\n" + jsonl(ROWS[:1]) + b"  \n\n" + jsonl(ROWS[1:]), "text/plain"),
        ("rows.json", json.dumps(ROWS).encode(), "application/octet-stream"),
        ("rows.json", json.dumps({"rows": ROWS}).encode(), "application/json"),
        ("rows", jsonl(ROWS).rstrip(b"\n"), "application/x-ndjson"),  # no newline at the end
        ("blob", jsonl(ROWS), "application/octet-stream"),  # sniffed: not one document
        ("blob", json.dumps({"rows": ROWS}).encode(), "application/octet-stream"),
        ("blob", json.dumps(ROWS, indent=2).encode(), ""),
    ],
    ids=["jsonl", "json-list", "json-rows", "ndjson-type", "sniffed-jsonl", "sniffed-rows", "list"],
)
async def test_a_dataset_file_makes_the_same_experiment_as_inline_rows(
    make_settings: Callable[..., Settings], sessions: Sessions, dataset: tuple[str, bytes, str]
) -> None:
    async with serve(create_app(make_settings())) as client:
        inline = await client.post("/v1/experiments", json=experiment(dataset={"rows": ROWS}))
        uploaded = await upload(client, dataset, spec())
        assert (inline.status_code, uploaded.status_code) == (202, 202), uploaded.text
        exp = uploaded.json()
        assert uploaded.headers["location"] == f"/v1/experiments/{exp['id']}"
        assert (exp["rows"], exp["name"], exp["scorer"]) == (3, "sums", {"kind": "math"})
        assert await items_of(client, exp["id"]) == await items_of(client, inline.json()["id"])
        items = (await client.get(f"/v1/experiments/{exp['id']}/items")).json()["items"]
        assert [i["row_id"] for i in items][:2] == ["q1", "q1"]
        first = (await client.get(f"/v1/tasks/{items[0]['task_id']}")).json()
        assert first["prompt"] == "What is 1 + 1?"
    assert await counts(sessions) == (2, 12, 4)


async def test_the_spec_may_come_as_a_file_part_too(make_settings: Callable[..., Settings]) -> None:
    async with serve(create_app(make_settings())) as client:
        answer = await client.post(
            "/v1/experiments",
            files=[
                ("spec", ("spec.json", spec(attempts=2).encode(), "application/json")),
                ("dataset", ("rows.jsonl", jsonl(ROWS), "application/octet-stream")),
            ],
        )
    assert answer.status_code == 202, answer.text
    assert (answer.json()["rows"], answer.json()["attempts"]) == (3, 2)


BAD_LINES = b'{"id": "a", "problem_statement": "p", "ground_truth": "1"}\n\n{not json\n[1, 2]\n'


@pytest.mark.parametrize(
    ("case", "spec_text", "dataset", "message", "loc"),
    [
        ("no spec", None, ("r.jsonl", jsonl(ROWS), ""), "`spec` part", ["body", "spec"]),
        (
            "spec not JSON",
            "{nope",
            ("r.jsonl", jsonl(ROWS), ""),
            "not valid JSON",
            ["body", "spec"],
        ),
        ("spec a list", "[1]", ("r.jsonl", jsonl(ROWS), ""), "JSON object", ["body", "spec"]),
        (
            "spec with a dataset",
            json.dumps(experiment()),
            ("r.jsonl", jsonl(ROWS), ""),
            "leave `dataset` out",
            ["body", "spec"],
        ),
        ("no dataset file", spec(), None, "`dataset` file part", ["body", "dataset"]),
        (
            "bad JSONL lines",
            spec(),
            ("r.jsonl", BAD_LINES, ""),
            "line 3: not valid JSON",
            ["body", "dataset", "line", 3],
        ),
        (
            "a JSONL line that is not an object",
            spec(),
            ("r.jsonl", BAD_LINES.replace(b"{not json", b""), ""),
            "line 4: a row must be a JSON object",
            ["body", "dataset", "line", 4],
        ),
        ("empty JSONL", spec(), ("r.jsonl", b"\n \n", ""), "no rows", ["body", "dataset", "rows"]),
        (
            "JSON not a dataset",
            spec(),
            ("r.json", b'{"a": 1}', ""),
            "list of rows",
            ["body", "dataset"],
        ),
        ("JSON broken", spec(), ("r.json", b"[{", ""), "not valid JSON", ["body", "dataset"]),
        (
            "JSON nested past the parser's depth",
            spec(),
            ("r.json", b"[" * 100_000 + b"]" * 100_000, ""),
            "nested too deeply",
            ["body", "dataset"],
        ),
        (
            "a JSONL line nested past the parser's depth",
            spec(),
            ("r.jsonl", jsonl(ROWS[:1]) + b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", ""),
            "line 2: not valid JSON (nested too deeply)",
            ["body", "dataset", "line", 2],
        ),
        (
            "a spec nested past the parser's depth",
            '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",
            ("r.jsonl", jsonl(ROWS), ""),
            "not valid JSON",
            ["body", "spec"],
        ),
        (
            "a JSON row that is not an object",
            spec(),
            ("r.json", json.dumps([ROWS[0], 5]).encode(), ""),
            "dataset.rows.1",
            ["body", "dataset", "rows", 1],
        ),
        (
            "a spec field of the wrong type",
            spec(attempts="two"),
            ("r.jsonl", jsonl(ROWS), ""),
            "attempts",
            ["body", "attempts"],
        ),
    ],
)
async def test_refused_uploads_are_422s_and_store_nothing(
    make_settings: Callable[..., Settings],
    sessions: Sessions,
    case: str,
    spec_text: str | None,
    dataset: tuple[str, bytes, str] | None,
    message: str,
    loc: list[Any],
) -> None:
    async with serve(create_app(make_settings())) as client:
        answer = await upload(client, dataset, spec_text)
    error = assert_error(answer, 422, "invalid_input")
    assert message in error["message"], (case, error)
    assert loc in [problem["loc"] for problem in error["details"]], (case, error)
    assert await counts(sessions) == (0, 0, 0)


async def test_every_bad_line_is_named_by_its_number(
    make_settings: Callable[..., Settings],
) -> None:
    lines = [json.dumps(ROWS[0]), "oops", "", "[]", json.dumps(ROWS[2]), "{"]
    async with serve(create_app(make_settings())) as client:
        answer = await upload(client, ("r.jsonl", "\n".join(lines).encode(), ""), spec())
    error = assert_error(answer, 422, "invalid_input")
    assert [p["line"] for p in error["details"]] == [2, 4, 6]
    assert "(and 2 more bad lines)" in error["message"]


async def test_uploaded_rows_get_the_inline_checks_naming_row_and_field(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    rows = [
        ROWS[0],
        {"id": "no-truth", "problem_statement": "p"},
        {"id": "q1", "problem_statement": "again", "ground_truth": "1"},
        {"problem_statement": "who am I", "ground_truth": "1"},
    ]
    settings = make_settings()
    async with serve(create_app(settings)) as client:
        answer = await upload(client, ("rows.jsonl", jsonl(rows), ""), spec())
        inline = await client.post("/v1/experiments", json=experiment(dataset={"rows": rows}))
    error = assert_error(answer, 422, "invalid_input")
    locs = [problem["loc"] for problem in error["details"]]
    assert ["body", "dataset", "rows", 1, "ground_truth"] in locs
    assert ["body", "dataset", "rows", 2, "id"] in locs
    assert ["body", "dataset", "rows", 3, "id"] in locs
    assert "'no-truth'" in error["message"], "the message names the row"
    assert error == assert_error(inline, 422, "invalid_input"), "the same 422 as inline rows"
    assert await counts(sessions) == (0, 0, 0)


async def test_the_server_limits_apply_to_uploaded_rows(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    async with serve(create_app(make_settings(experiment_max_rows=2))) as client:
        answer = await upload(client, ("rows.jsonl", jsonl(ROWS), ""), spec())
    error = assert_error(answer, 422, "invalid_input")
    assert ["body", "dataset", "rows"] in [p["loc"] for p in error["details"]]
    assert await counts(sessions) == (0, 0, 0)


async def test_a_dataset_past_the_size_limit_is_a_413_and_stores_nothing(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    big = jsonl([{**ROWS[0], "id": f"r{i}", "pad": "x" * 100} for i in range(40)])
    assert len(big) > 4096
    async with serve(create_app(make_settings(experiment_max_dataset_bytes=4096))) as client:
        answer = await upload(client, ("rows.jsonl", big, ""), spec())
        error = assert_error(answer, 413, "too_large")
        assert "SANDHIVE_EXPERIMENT_MAX_DATASET_BYTES" in error["message"]
        fits = await upload(client, ("rows.jsonl", big[:4000].rsplit(b"\n", 1)[0], ""), spec())
        assert fits.status_code == 202, fits.text
    assert (await counts(sessions))[0] == 1


class Unsized:
    """A part that does not say its size (a client streaming it): counted while read."""

    filename = "rows.jsonl"
    content_type = "application/octet-stream"
    size = None

    def __init__(self, total: int) -> None:
        self.left = total
        self.read_bytes = 0

    async def read(self, size: int = -1) -> bytes:
        chunk = b"x" * min(size if size > 0 else self.left, self.left)
        self.left -= len(chunk)
        self.read_bytes += len(chunk)
        return chunk


async def test_a_part_of_unknown_size_is_cut_off_once_past_the_limit() -> None:
    part = Unsized(total=10 * 2**20)
    with pytest.raises(TooLarge):
        await experiment_upload.read_file(part, limit=100_000)
    assert part.read_bytes <= 100_000 + experiment_upload.CHUNK_BYTES, "never read it all"


async def test_openapi_describes_json_and_multipart_bodies_on_one_operation_each(
    client: Any,
) -> None:
    """One body type per operation, so client generators make one function of each."""
    schema = (await client.get("/openapi.json")).json()
    body = schema["paths"]["/v1/experiments"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json"}
    upload_body = schema["paths"]["/v1/experiments/upload"]["post"]["requestBody"]["content"]
    assert set(upload_body) == {"multipart/form-data"}
    assert upload_body["multipart/form-data"]["schema"]["required"] == ["spec", "dataset"]


async def test_the_upload_operation_takes_the_same_parts_and_nothing_else(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    async with serve(create_app(make_settings())) as client:
        files = [("dataset", ("rows.jsonl", jsonl(ROWS), "application/x-ndjson"))]
        made = await client.post("/v1/experiments/upload", data={"spec": spec()}, files=files)
        assert made.status_code == 202, made.text
        assert made.headers["location"] == f"/v1/experiments/{made.json()['id']}"
        assert made.json()["rows"] == 3
        as_json = await client.post("/v1/experiments/upload", json=experiment())
        assert_error(as_json, 415, "unsupported_media_type")
    assert (await counts(sessions))[0] == 1
