"""Schemathesis hooks (SCHEMATHESIS_HOOKS): every error answer has the contract's shape."""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

import schemathesis
from schemathesis.transport.serialization import Binary

from app.config import Settings


@schemathesis.check
def error_shape(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx/5xx body is exactly {"error": {"code", "message", "details"}}."""
    if response.status_code < 400:
        return None
    try:
        body = json.loads(response.content)
    except ValueError as exc:
        raise AssertionError(
            f"error {response.status_code} is not JSON: {response.content[:200]!r}"
        ) from exc
    if not isinstance(body, dict) or set(body) != {"error"}:
        raise AssertionError(f"error body is not {{'error': ...}}: {body!r:.200}")
    error = body["error"]
    if not isinstance(error, dict) or set(error) != {"code", "message", "details"}:
        raise AssertionError(f"error object keys are {sorted(error)!r}")
    if not isinstance(error["code"], str) or not isinstance(error["message"], str):
        raise AssertionError("error code and message must be strings")
    if "Traceback" in response.text:
        raise AssertionError("a stack trace in an error body")
    return True


# Rules the OpenAPI document does not state, taught to the generator. The document states
# every rule it can (app/api/openapi_rules.py); these depend on stored data, on file
# contents or on what an address is, or (NUL nowhere inside a free JSON value) need a
# recursive schema that openapi-python-client cannot parse. A schema-valid request that
# breaks one is refused on purpose. Each hook changes only schema-valid (positive) cases,
# on copies, and only the part the rule is about, so that `positive_data_acceptance` runs
# on every operation and the negative phase is untouched.

PUBLIC_HOST = "receiver.invalid"
"""A webhook URL's host must be a public address (SSRF): the server refuses a private or
loopback literal, which the generator draws as readily as any host. A name under `.invalid`
never resolves (RFC 2606), and nothing delivers here: the fuzzed server runs no worker."""


def _positive(case: Any) -> bool:
    """Whether every part of the case was drawn valid (a negative case stays as drawn)."""
    meta = getattr(case, "meta", None)
    return (
        meta is not None
        and meta.generation.mode.is_positive
        and all(part.mode.is_positive for part in meta.components.values())
    )


@schemathesis.hook("map_case").apply_to(
    method="GET", path="/v1/experiments/{experiment_id}/results"
)
def existing_grading(ctx: Any, case: Any) -> Any:
    """`grading=N` must be one the experiment has: 1 always is."""
    if _positive(case) and case.query and "grading" in case.query:
        case.query = {**case.query, "grading": 1}
    return case


@schemathesis.hook("map_case").apply_to(method="POST", path="/v1/webhooks")
def public_webhook_url(ctx: Any, case: Any) -> Any:
    if _positive(case) and isinstance(case.body, dict) and isinstance(case.body.get("url"), str):
        case.body = {**case.body, "url": _public(case.body["url"])}
    return case


@schemathesis.hook("map_case").apply_to(method="POST", path="/v1/tasks")
def task_fits(ctx: Any, case: Any) -> Any:
    """An Idempotency-Key names one submission: a new body needs a new key. The multipart
    `task` part is a task as JSON: a file's content, typed as text."""
    if not _positive(case):
        return case
    if case.headers and "Idempotency-Key" in case.headers:
        case.headers["Idempotency-Key"] = uuid.uuid4().hex
    if case.media_type == "multipart/form-data" and isinstance(case.body, dict):
        # A file part's name is its path: two parts of one name are one path twice.
        files = case.body.get("files")
        one = {"files": files[:1]} if isinstance(files, list) else {}
        _edit_parts(case, {"task": json.dumps({"prompt": "What is 6 x 7?"}), **one})
    elif isinstance(case.body, dict):
        case.body = copy.deepcopy(case.body)
        _fit_task(case.body)
    return case


@schemathesis.hook("map_case").apply_to(method="POST", path="/v1/tasks/batch")
def batch_keys_fit(ctx: Any, case: Any) -> Any:
    if _positive(case) and isinstance(case.body, dict) and isinstance(case.body.get("tasks"), list):
        case.body = copy.deepcopy(case.body)
        for task in case.body["tasks"]:
            if isinstance(task, dict):
                _fit_task(task)
                if task.get("idempotency_key") is not None:
                    task["idempotency_key"] = uuid.uuid4().hex
    return case


def _fit_task(task: dict[str, Any], *, vanilla: bool = False) -> None:
    """A tenant's own image (`built/NAME`) must have been built: the catalogue's stands in.
    A task's own webhook is signed with a subscription's secret, which the tenant may lack.
    Input files' paths must differ (and the verifier's), and a vanilla task's files are
    text (its message embeds them)."""
    if isinstance(task.get("metadata"), dict):
        task["metadata"] = _no_nul(task["metadata"])
    if isinstance(task.get("llm"), dict) and isinstance(task["llm"].get("extra_body"), dict):
        task["llm"]["extra_body"] = _no_nul(task["llm"]["extra_body"])
    if task.get("webhook") is not None:
        task["webhook"] = None  # signed with a subscription's secret: the tenant may have none
    sandbox = task.get("sandbox")
    if isinstance(sandbox, dict) and str(sandbox.get("image", "")).startswith("built/"):
        sandbox["image"] = "default"
    vanilla = vanilla or task.get("mode") == "vanilla"
    for i, item in enumerate(task.get("input_files") or []):
        if isinstance(item, dict):
            item["path"] = f"file{i}.txt"
            if vanilla:
                item["content_base64"] = "aGk="
    verifier = task.get("verifier")
    for i, item in enumerate(verifier.get("files") or [] if isinstance(verifier, dict) else []):
        if isinstance(item, dict):
            item["path"] = f"check{i}.sh"  # the verifier's files' paths must differ too


@schemathesis.hook("map_case").apply_to(method="POST", path="/v1/tasks/{task_id}/fork")
def fork_llm_fits(ctx: Any, case: Any) -> Any:
    """A fork's model options are a task's: no NUL inside `extra_body`."""
    llm = case.body.get("llm") if _positive(case) and isinstance(case.body, dict) else None
    if isinstance(llm, dict) and isinstance(llm.get("extra_body"), dict):
        case.body = {**case.body, "llm": {**llm, "extra_body": _no_nul(llm["extra_body"])}}
    return case


@schemathesis.hook("map_case").apply_to(method="POST", path="/v1/episodes/{episode_id}/step")
def step_message_fits(ctx: Any, case: Any) -> Any:
    if (
        _positive(case)
        and isinstance(case.body, dict)
        and isinstance(case.body.get("message"), dict)
    ):
        case.body = {**case.body, "message": _no_nul(case.body["message"])}
    return case


def _no_nul(value: Any) -> Any:
    """A free JSON value without NUL in its keys and text, the server's rule for one (the
    document says it in words: openapi-python-client cannot parse the recursive schema)."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, list):
        return [_no_nul(item) for item in value]
    if isinstance(value, dict):
        return {_no_nul(key): _no_nul(item) for key, item in value.items()}
    return value


def _public(url: str) -> str:
    """`url` with its host replaced by a public name (its path and query kept)."""
    scheme, _, rest = url.partition("://")
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    return f"{scheme}://{PUBLIC_HOST}{rest[cut:]}"


# Experiments: a dataset is data. Its rows must have unique ids, the fields the scorer reads
# (a ground truth, IFEval's instructions, a Harbor verifier) and every arm's `prompt_field`;
# `start_id`/`end_id` must name rows; `python` code must parse and define `compute_score`,
# a `regex` pattern compile, `mcq` choices not repeat a letter; an experiment's `webhook`
# is signed with a subscription's secret, which the tenant may not have. Everything else
# of the body stays as drawn.

SCORED_CODE = "def compute_score(agent_answer, ground_truth, **row):\n    return 1.0\n"
IFEVAL = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
VERIFIER = {"files": {"test.sh": "echo 1 > /logs/verifier/reward.txt\n"}}
MAX_ITEMS = int(Settings.model_fields["experiment_max_items"].default)


@schemathesis.hook("map_case").apply_to(method="POST", path="/v1/experiments")
def experiment_rows_fit(ctx: Any, case: Any) -> Any:
    if _positive(case) and isinstance(case.body, dict):
        case.body = copy.deepcopy(case.body)  # phases share drawn parts between cases
        _fit_experiment(case.body)
    return case


@schemathesis.hook("map_case").apply_to(
    method="POST", path="/v1/experiments/{experiment_id}/regrade"
)
def regrade_scorer_fits(ctx: Any, case: Any) -> Any:
    if (
        _positive(case)
        and isinstance(case.body, dict)
        and isinstance(case.body.get("scorer"), dict)
    ):
        case.body = copy.deepcopy(case.body)
        _fit_scorer(case.body["scorer"], regrade=True)
    return case


@schemathesis.hook("map_case").apply_to(method="POST", path="/v1/experiments/upload")
def upload_parts_are_files(ctx: Any, case: Any) -> Any:
    """The `spec` part is JSON and the `dataset` file JSON Lines: file contents."""
    if _positive(case) and isinstance(case.body, dict):
        spec = {"name": "fuzz", "arms": [{"name": "a"}], "scorer": {"kind": "exact"}}
        row = {"id": "r1", "problem_statement": "What is 6 x 7?", "ground_truth": "42"}
        parts = {"spec": json.dumps(spec), "dataset": Binary((json.dumps(row) + "\n").encode())}
        _edit_parts(case, parts)
    return case


def _edit_parts(case: Any, parts: dict[str, Any]) -> None:
    """Replace the parts a multipart case has (never add one: a case without a required
    part is negative), and take the edit as what was drawn: schemathesis cannot validate a
    body holding a file, so it would relabel any edited one negative."""
    case.body = {**case.body, **{key: value for key, value in parts.items() if key in case.body}}
    case._record_starting_state()


def _fit_experiment(body: dict[str, Any]) -> None:
    scorer = body.get("scorer")
    if isinstance(scorer, dict):
        _fit_scorer(scorer)
    arms = [arm for arm in body.get("arms", []) if isinstance(arm, dict)]
    for i, arm in enumerate(arms):
        arm["name"] = f"arm{i}"
        if isinstance(arm.get("task"), dict):
            _fit_task(arm["task"], vanilla=arm.get("mode") == "vanilla")
    fields = {arm["prompt_field"] for arm in arms if isinstance(arm.get("prompt_field"), str)}
    kind = scorer.get("kind") if isinstance(scorer, dict) else None
    rows = body.get("dataset", {}).get("rows", [])
    for i, row in enumerate(rows):
        _fit_row(row, f"row{i}", kind, fields)
    if rows:
        if body.get("start_id") is not None:
            body["start_id"] = rows[0]["id"]
        if body.get("end_id") is not None:
            body["end_id"] = rows[-1]["id"]
    if isinstance(body.get("metadata"), dict):
        body["metadata"] = _no_nul(body["metadata"])
    if len(rows) * len(arms) * int(body.get("attempts", 1)) > MAX_ITEMS:
        body["attempts"] = 1
    body["webhook"] = None


def _fit_row(row: dict[str, Any], row_id: str, kind: object, fields: set[str]) -> None:
    row.update(_no_nul(row))
    row["id"] = row_id
    if isinstance(row.get("input_files"), str):
        row["input_files"] = "{}"
    for key in ("image", "verifier", *IFEVAL):
        row.pop(key, None)
    if row.get("ground_truth") in (None, "", []):
        row["ground_truth"] = "42"
    if kind == "instruction_following":
        row.update(IFEVAL)
    if kind == "verifier":
        row["verifier"] = VERIFIER
    for field in fields - {"id"}:
        row[field] = "{}"  # text, and JSON where the field is `input_files`


def _fit_scorer(scorer: dict[str, Any], *, regrade: bool = False) -> None:
    """Code that runs, a pattern that compiles, choices that differ; a regrade's scorer
    reads only what the stored rows hold (their ground truths)."""
    kind = scorer.get("kind")
    if regrade and kind == "instruction_following":
        scorer.clear()
        scorer["kind"] = "exact"
    if kind == "python":
        scorer["code"] = SCORED_CODE
    elif kind == "regex" and isinstance(scorer.get("pattern"), str):
        scorer["pattern"] = "4[0-9]"
    elif kind == "mcq" and isinstance(scorer.get("choices"), str):
        scorer["choices"] = "ABCD"
