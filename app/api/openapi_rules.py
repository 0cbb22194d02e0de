"""Rules the server enforces that the wire models alone leave out of /openapi.json.

A schema-valid request must not be refused (a generated client, or a fuzzer's positive
phase, trusts the document), and a request the server takes must not be schema-invalid.
So what this server's settings decide is stated for this server, and what the models
check across fields is stated in JSON Schema where JSON Schema can say it:

- the sandbox options this server's settings allow: `network: "egress"` only where egress
  is on, `read_only_rootfs: false` only where the operator allows it, `allow_domains` only
  with `network: "egress"` on a server that filters by name (null elsewhere);
- the LLM profiles it has and the models each takes, for a task and an `llm_judge`;
- a scorer spec, one branch per kind (`app.scoring.spec_schema`), and an experiment arm's
  `task` as the task options it is (a task less `prompt`, `input_files`, `mode` and
  `webhook`), a dataset row's known fields;
- a map whose keys have a pattern (environment variables) takes no other key: Pydantic
  says it with `patternProperties` alone, which admits any key that does not match;
- JSON objects (metadata, `extra_body`, rows) have no NUL in a key, and `extra_body` sets
  none of the fields the server sets;
- base64 is base64 (`validate=True`: the alphabet and its padding), and an exec's `stdin`
  is base64 when `stdin_encoding` says so;
- `llm.base_url` only as one of the operator's `SANDHIVE_LLM_ALLOWED_BASE_URLS`;
- a fork's `n` up to `SANDHIVE_FORK_MAX_CHILDREN`;
- `sandbox.image` a catalogue image or `built/NAME`, `prompt_config` a config this server
  knows or a pair whose templates format and whose directories lie inside the workdir,
  an input file's path relative and normal; a vanilla task names no tools and no
  sandbox prompt config;
- no NUL in a query parameter (`UrlGuard` refuses one before any route);
- a webhook URL is http(s) with a host and no credentials, without spaces or control
  characters (whether its address is public is asked of the address, not of the text:
  no schema can say it).
"""

from __future__ import annotations

import re
from typing import Any

from app.config import Settings
from app.domain.image_catalogue import catalogue_or_default
from app.domain.prompt_configs import BUILTIN, DEFAULT, known_names
from app.domain.resolve import MAX_PATH_CHARS, profile_name
from app.schemas.images import BUILD_NAME, BUILT_PREFIX
from app.schemas.tasks import MAX_JSON_KEYS, RESERVED_EXTRA_BODY, LLMOptions
from app.scoring.python_code import PythonLimits
from app.scoring.spec_schema import scorer_schema
from app.services.experiments.input import MAX_ROW_ID_CHARS, SET_PER_ROW

SANDBOX_SCHEMAS = ("SandboxRequest", "SandboxCreate")
NO_NUL = r"^[^\x00]*$"
TEXT = r"^[^\x00]*\S[^\x00]*$"
"""Not only whitespace, and no NUL."""
WEBHOOK_URL = r"^[Hh][Tt][Tt][Pp][Ss]?://[^\x00-\x20\x7f/?#@\\]+([/?#][^\x00-\x20\x7f]*)?$"
"""http(s), a host, no user part, no space or control character (`check_url`'s syntax)."""
WEBHOOK_URL_SCHEMAS = (
    ("WebhookCreate", "url"),
    ("ExperimentWebhook", "url"),
    ("TaskWebhook", "url"),
)
BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
"""What `base64.b64decode(text, validate=True)` takes."""
BASE64_FIELDS = (("ImageBuildCreate", "context"),)
_B64 = r"[A-Za-z0-9+/]\s*"
BASE64_WRAPPED = rf"^\s*(?:(?:{_B64}){{4}})*(?:(?:{_B64}){{2}}=\s*=|(?:{_B64}){{3}}=)?\s*$"
"""Base64 that may be wrapped over lines (an input file's, as the `base64` command writes)."""
_SEGMENT = r"(?:[^/.\x00][^/\x00]*|\.[^/.\x00][^/\x00]*|\.\.[^/\x00]+)"
RELATIVE_PATH = rf"^{_SEGMENT}(?:/{_SEGMENT})*$"
"""No leading `/`, no empty, `.` or `..` segment, no NUL."""
TASK_SCHEMAS = ("TaskCreate", "TaskBatchItem", "EpisodeCreate")
BUILT_IMAGE = "^" + re.escape(BUILT_PREFIX) + BUILD_NAME.removeprefix("^")
ARM_TASK_LEAVES_OUT = (*SET_PER_ROW, "webhook")
"""What an experiment sets per item, or refuses in an arm's task."""


def apply(schema: dict[str, Any], settings: Settings) -> None:
    """Add the rules above to FastAPI's document, in place."""
    components = schema["components"]["schemas"]
    model_rules = _model_rules(settings)  # one per profile, for a task's llm and a judge's
    _llm_profiles(components, settings, model_rules)
    _scorers(components, settings, model_rules)
    _task_parts(components, settings)
    _experiment_parts(components)
    _forks(components, settings)
    _texts(components)
    _json_objects(components)
    for model in components.values():
        _keys_by_pattern(model)
    for name in SANDBOX_SCHEMAS:
        if name in components:
            _sandbox_options(components[name], settings)
    for item in schema["paths"].values():
        for method, operation in item.items():
            if method != "parameters":
                _query_without_nul(operation)


NUL_FREE = (
    ("TaskCreate", "prompt", TEXT),
    ("TaskBatchItem", "prompt", TEXT),
    ("TaskBatchItem", "idempotency_key", NO_NUL),
    ("LLMOptions", "model", NO_NUL),
    ("Verifier", "command", NO_NUL),
    ("ExperimentCreate", "name", NO_NUL),
)
"""Text the server refuses with NUL in it (`check_text`: Postgres stores none)."""


def _texts(components: dict[str, Any]) -> None:
    """Webhook URLs, base64 fields, NUL-free text."""
    for name, field, pattern in NUL_FREE:
        _string_pattern(components[name]["properties"][field], pattern)
    for name, field in WEBHOOK_URL_SCHEMAS:
        components[name]["properties"][field]["pattern"] = WEBHOOK_URL
    for name, field in BASE64_FIELDS:
        _string_pattern(components[name]["properties"][field], BASE64)
    stdin = {"anyOf": [{"type": "string", "pattern": BASE64}, {"type": "null"}]}
    base64_stdin = {
        "if": {
            "required": ["stdin_encoding"],
            "properties": {"stdin_encoding": {"const": "base64"}},
        },
        "then": {"properties": {"stdin": stdin}},
    }
    exec_request = components["ExecRequest"]
    exec_request["allOf"] = [*exec_request.get("allOf", []), base64_stdin]


def _sandbox_options(model: dict[str, Any], settings: Settings) -> None:
    props = model["properties"]
    if not settings.sandbox_egress_enabled:
        props["network"]["enum"] = ["none"]
    if not settings.sandbox_allow_writable_rootfs:
        props["read_only_rootfs"]["enum"] = [True]
    if not (settings.sandbox_egress_enabled and settings.sandbox_egress_proxy):
        description = props["allow_domains"].get("description")
        props["allow_domains"] = {"type": "null", "default": None}
        if description:
            props["allow_domains"]["description"] = description
        return
    model["if"] = {
        "required": ["allow_domains"],
        "properties": {"allow_domains": {"type": "array"}},
    }
    model["then"] = {"required": ["network"], "properties": {"network": {"const": "egress"}}}


def _query_without_nul(operation: dict[str, Any]) -> None:
    for parameter in operation.get("parameters", []):
        found = parameter.get("schema", {})
        if (
            parameter.get("in") == "query"
            and found.get("type") == "string"
            and "enum" not in found
            and "pattern" not in found
        ):
            found["pattern"] = NO_NUL


def _string_pattern(prop: dict[str, Any], pattern: str) -> None:
    """`pattern` on the property's string form (itself, or its `anyOf` branch)."""
    for branch in [prop, *prop.get("anyOf", [])]:
        if branch.get("type") == "string":
            branch["pattern"] = pattern


def _model_rules(settings: Settings) -> list[dict[str, Any]]:
    """For each profile that limits its models (or has no default model): `if` it is the
    profile, `then` the model is one it takes."""
    rules = []
    for name, profile in sorted(settings.llm_profiles().items()):
        if profile.models:
            allowed: list[Any] = sorted({*profile.models, profile.model} - {""})
            then: dict[str, Any] = {"properties": {"model": {"enum": allowed}}}
            if profile.model:
                allowed.append(None)
            else:  # no default model: the task names one
                then["required"] = ["model"]
        elif not profile.model:
            then = {"required": ["model"], "properties": {"model": {"type": "string"}}}
        else:
            continue
        when = {"required": ["profile"], "properties": {"profile": {"const": name}}}
        rules.append({"if": when, "then": then})
    return rules


def default_profile(settings: Settings) -> str | None:
    """The profile a task that names none runs on (`resolve.profile_name`); None: it must
    name one."""
    profiles = settings.llm_profiles()
    name = profile_name(LLMOptions(), profiles)
    return name if name in profiles else None


def _llm_profiles(
    components: dict[str, Any], settings: Settings, rules: list[dict[str, Any]]
) -> None:
    model = components["LLMOptions"]
    names = sorted(settings.llm_profiles())
    prop = model["properties"]["profile"]
    if names:  # none: no task can run here, which no schema says (an enum is not empty)
        prop["enum"] = names
    fallback = default_profile(settings)
    if fallback is None:  # a task names its profile, so it has an `llm`
        prop.pop("default", None)
        model.setdefault("required", []).append("profile")
        for name in TASK_SCHEMAS:
            components[name].setdefault("required", []).append("llm")
    else:
        prop["default"] = fallback
    allowed = sorted({url.rstrip("/") for url in settings.llm_allowed_base_urls})
    base_url = model["properties"]["base_url"]
    base_url["anyOf"] = [{"type": "null"}]
    if allowed:  # exact, a trailing `/` ignored
        base_url["anyOf"].insert(0, {"enum": [u for url in allowed for u in (url, url + "/")]})
    unnamed = {"not": {"required": ["profile"]}}  # a task naming none runs on the fallback
    own = [
        {**rule, "if": {"anyOf": [rule["if"], unnamed]}}
        if rule["if"]["properties"]["profile"]["const"] == fallback
        else rule
        for rule in rules
    ]
    if own:
        model["allOf"] = own


def _scorers(components: dict[str, Any], settings: Settings, rules: list[dict[str, Any]]) -> None:
    limits = PythonLimits.from_settings(settings)
    profiles = sorted(settings.llm_profiles())
    every = scorer_schema(limits, profiles, rules)
    regrade = scorer_schema(limits, profiles, rules, kinds=_kinds(every) - {"verifier"})
    for name, field, spec in (
        ("ExperimentCreate", "scorer", every),
        ("RegradeIn", "scorer", regrade),
        ("EpisodeCreate", "scorer", every),
    ):
        prop = components[name]["properties"][field]
        described = {key: prop[key] for key in ("description", "title") if key in prop}
        nullable = any(branch.get("type") == "null" for branch in prop.get("anyOf", []))
        found = {"anyOf": [spec, {"type": "null"}]} if nullable else spec
        components[name]["properties"][field] = {**found, **described}


def _kinds(spec: dict[str, Any]) -> set[str]:
    return {branch["properties"]["kind"]["const"] for branch in spec["oneOf"]}


def _experiment_parts(components: dict[str, Any]) -> None:
    task = components["TaskCreate"]
    props = {k: v for k, v in task["properties"].items() if k not in ARM_TASK_LEAVES_OUT}
    components["ArmTask"] = {
        "type": "object",
        "title": "ArmTask",
        "description": "A task's options for every item of an arm (`TaskCreate` less what "
        "each item sets: `prompt`, `input_files`, `mode`; and no `webhook`).",
        "properties": props,
        "additionalProperties": False,
    }
    if "llm" in task.get("required", []):  # no default profile: an arm names one too
        components["ArmTask"]["required"] = ["llm"]
        components["ArmCreate"].setdefault("required", []).append("task")
    arm = components["ArmCreate"]["properties"]
    arm["task"] = {
        "$ref": "#/components/schemas/ArmTask",
        "description": arm["task"]["description"],
    }
    rows = components["DatasetIn"]["properties"]["rows"]
    rows["items"] = {
        "type": "object",
        "properties": {
            "id": {
                "anyOf": [
                    {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_ROW_ID_CHARS,
                        "pattern": TEXT,
                    },
                    {"type": "integer"},
                ],
                "description": "Unique in the dataset.",
            },
            "problem_statement": {"type": "string", "minLength": 1, "pattern": TEXT},
            "input_files": {
                "anyOf": [
                    {
                        "type": "object",
                        "propertyNames": {"pattern": RELATIVE_PATH, "maxLength": MAX_PATH_CHARS},
                        "additionalProperties": {
                            "anyOf": [{"type": "string", "pattern": NO_NUL}, {"type": "null"}]
                        },
                    },
                    {"type": "string", "contentMediaType": "application/json"},
                    {"type": "null"},
                ],
                "description": "Path to text (null: none), or that object as a JSON string.",
            },
            "ground_truth": {"description": "What the scorer compares the answer with."},
        },
        "required": ["id", "problem_statement"],
        "propertyNames": {"pattern": NO_NUL},
        "additionalProperties": True,
    }


def _keys_by_pattern(node: Any) -> None:
    if isinstance(node, dict):
        if "patternProperties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _keys_by_pattern(value)
    elif isinstance(node, list):
        for value in node:
            _keys_by_pattern(value)


def _template(names: tuple[str, ...]) -> str:
    """A template `str.format` takes with these names: other braces doubled (and no NUL)."""
    return rf"^(?:[^{{}}\x00]|\{{\{{|\}}\}}|\{{(?:{'|'.join(names)})\}})*$"


def _task_parts(components: dict[str, Any], settings: Settings) -> None:
    names = sorted(catalogue_or_default(settings))
    for name in SANDBOX_SCHEMAS:
        if name in components:
            prop = components[name]["properties"]["image"]
            prop.pop("type", None)
            prop["anyOf"] = [{"enum": names}, {"type": "string", "pattern": BUILT_IMAGE}]
    known = known_names(settings.prompt_configs_dir)
    for name in TASK_SCHEMAS:
        prop = components[name]["properties"]["prompt_config"]
        prop["anyOf"] = [
            {"enum": known} if branch.get("type") == "string" else branch
            for branch in prop["anyOf"]
        ]
    dirs = ("working_dir", "input_dir", "output_dir")
    pair = components["PromptPair"]["properties"]
    pair["system"]["pattern"] = _template((*dirs, "command_docs", "demo"))
    pair["instance"]["pattern"] = _template((*dirs, "problem_statement"))
    workdir = settings.sandbox_workdir.rstrip("/")
    inside = rf"^{re.escape(workdir)}(?:/{_SEGMENT})*/?$"
    pair["working_dir"]["anyOf"] = [{"enum": [workdir, workdir + "/"]}, {"type": "null"}]
    for key in ("input_dir", "output_dir"):
        pair[key]["anyOf"] = [{"type": "string", "pattern": inside}, {"type": "null"}]
    files = components["InputFile"]["properties"]
    files["content_base64"]["pattern"] = BASE64_WRAPPED
    files["path"]["pattern"] = RELATIVE_PATH
    sandbox_prompts = sorted(set(BUILTIN) - {DEFAULT})
    for name in ("TaskCreate", "TaskBatchItem"):
        rule = {"if": VANILLA, "then": _no_sandbox_options(sandbox_prompts)}
        components[name]["allOf"] = [*components[name].get("allOf", []), rule]
    arm = {"if": VANILLA, "then": {"properties": {"task": _no_sandbox_options(sandbox_prompts)}}}
    components["ArmCreate"]["allOf"] = [*components["ArmCreate"].get("allOf", []), arm]


def _forks(components: dict[str, Any], settings: Settings) -> None:
    """A fork's `n` up to this server's `SANDHIVE_FORK_MAX_CHILDREN`."""
    for name in ("TaskForkIn", "EpisodeForkIn"):
        if name in components:
            components[name]["properties"]["n"]["maximum"] = settings.fork_max_children


VANILLA = {"required": ["mode"], "properties": {"mode": {"const": "vanilla"}}}


def _no_sandbox_options(sandbox_prompts: list[str]) -> dict[str, Any]:
    """A vanilla task offers no tools and takes no prompt config written for the sandbox."""
    prompt = {
        "required": ["prompt_config"],
        "properties": {"prompt_config": {"enum": sandbox_prompts}},
    }
    return {"not": {"anyOf": [{"required": ["tools"]}, prompt]}}


def _json_objects(components: dict[str, Any]) -> None:
    """Every free JSON object (`JsonObject`: at most MAX_JSON_KEYS keys, nothing else said)
    has NUL-free keys. Its values are left free in the schema and the rule is said in
    words: a recursive JSON value schema is exact, but openapi-python-client cannot
    parse one (it drops every operation that uses it)."""
    for model in list(components.values()):
        for prop in model.get("properties", {}).values():
            for branch in [prop, *prop.get("anyOf", []), prop.get("items") or {}]:
                if (
                    branch.get("type") == "object"
                    and branch.get("additionalProperties") is True
                    and branch.get("maxProperties") == MAX_JSON_KEYS
                    and "properties" not in branch
                ):
                    branch["propertyNames"] = {"pattern": NO_NUL}
                    note = "No key or text inside it may hold NUL (Postgres stores none)."
                    prop["description"] = f"{prop.get('description', '').rstrip()} {note}".strip()
    extra = components["LLMOptions"]["properties"]["extra_body"]
    extra["not"] = {"anyOf": [{"required": [key]} for key in sorted(RESERVED_EXTRA_BODY)]}
