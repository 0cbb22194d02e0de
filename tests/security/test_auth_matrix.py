"""Authentication and tenant isolation over every route (RELIABILITY A-33, A-34).

The routes come from the app itself (its OpenAPI document and its WebSocket
routes), so a route added later is covered, or fails the "public routes" test
until someone decides it may be public.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import pytest
import websockets
from fastapi.routing import APIRoute, APIWebSocketRoute
from websockets.exceptions import InvalidStatus

from app.api.app import ROUTERS, create_app
from app.api.deps import current_tenant
from app.config import Settings
from app.db.engine import Sessions
from app.services import keys
from tests.api.conftest import assert_error
from tests.api.live_server import live_server
from tests.security.conftest import ADMIN_KEY, TenantKeys, bearer
from tests.support.rows import insert_artifact, insert_step

PUBLIC = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")}
"""Operations that need no key; every other one must answer 401 without a valid key."""
PUBLIC_PATHS = {
    *("/healthz", "/readyz", "/metrics", "/", "/static/{name}"),
    *("/docs", "/docs/assets/{name}"),
}
"""Routes outside /v1: probes, metrics (no tenant data), the browser page (asks for a key)
and the API docs (the schema only)."""
WAIT_S = 20.0
TASK = {"prompt": "compute", "metadata": {"n": 1}}
EXPERIMENT = {
    "name": "e",
    "dataset": {"rows": [{"id": "r", "problem_statement": "p", "ground_truth": "1"}]},
    "arms": [{"name": "a"}],
    "scorer": {"kind": "exact"},
}
UNKNOWN_EXPERIMENT = "exp_01JZZZZZZZZZZZZZZZZZZZZZZZ"


def operations(settings: Settings) -> list[tuple[str, str]]:
    """Every (method, path template) of the OpenAPI document."""
    spec = create_app(settings).openapi()
    return [
        (method.upper(), path)
        for path, item in spec["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    ]


def fill(
    path: str, task_id: str, experiment_id: str = UNKNOWN_EXPERIMENT, webhook_id: str = "wh_none"
) -> str:
    return (
        path.replace("{task_id}", task_id)
        .replace("{path}", "answer.txt")
        .replace("{experiment_id}", experiment_id)
        .replace("{webhook_id}", webhook_id)
        .replace("{episode_id}", "epi_01JZZZZZZZZZZZZZZZZZZZZZZZ")
        .replace("{sandbox_id}", "sbx_01JZZZZZZZZZZZZZZZZZZZZZZZ")
        .replace("{name}", "no-such-image")
    )


def bad_credentials(k: TenantKeys) -> dict[str, dict[str, str]]:
    return {
        "none": {},
        "empty bearer": {"Authorization": "Bearer"},
        "malformed": {"Authorization": "Bearer-" + k.a},
        "wrong scheme": {"Authorization": f"Basic {k.a}"},
        "unknown key": bearer("shv_0123456789abcdef_" + "A" * 43),
        "tampered key": bearer(k.a[:-1] + ("A" if k.a[-1] != "A" else "B")),
        "revoked key": bearer(k.revoked),
        "token in the query": {},  # ?token= is for WebSockets only
    }


async def a_task_with_everything(client: httpx.AsyncClient, sessions: Sessions, key: str) -> str:
    """A task of the key's tenant with a step and an artifact."""
    response = await client.post("/v1/tasks", json=TASK, headers=bearer(key))
    assert response.status_code == 202, response.text
    task_id: str = response.json()["id"]
    await insert_step(sessions, task_id, 1, 0)
    await insert_artifact(sessions, task_id, "answer.txt", b"42\n", "text/plain")
    return task_id


async def an_experiment(client: httpx.AsyncClient, key: str) -> str:
    response = await client.post("/v1/experiments", json=EXPERIMENT, headers=bearer(key))
    assert response.status_code == 202, response.text
    experiment_id: str = response.json()["id"]
    return experiment_id


EXACT_BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/tasks"): TASK,
    ("POST", "/v1/experiments"): EXPERIMENT,
    ("POST", "/v1/tasks/batch"): {"tasks": [TASK]},
    ("POST", "/v1/webhooks"): {
        "url": "https://hooks.example.com/sandhive",
        "events": ["task.finished"],
    },
    ("POST", "/v1/episodes"): {"prompt": "p"},
    ("POST", "/v1/sandboxes"): {},
    ("POST", "/v1/images/builds"): {"name": "matrix", "dockerfile": "FROM default\n"},
}
POST_BODIES_BY_SUFFIX: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("/regrade",), {"scorer": {"kind": "exact"}}),
    (("/step",), {"message": {"role": "assistant", "content": "hi"}}),
    (("/exec", "/exec/stream"), {"argv": ["true"]}),
    (("/ttl",), {"ttl_s": 60}),
)


def body_of(method: str, path: str) -> Any:
    """A valid body for the operation, so that what answers is the key check, not a 422."""
    if (method, path) in EXACT_BODIES:
        return EXACT_BODIES[(method, path)]
    if method == "POST" and path.endswith("/fork"):
        return {"n": 1} if path.startswith("/v1/episodes/") else {"step": 0}
    if method == "POST":
        for suffixes, body in POST_BODIES_BY_SUFFIX:
            if path.endswith(suffixes):
                return body
    return None


async def call(
    client: httpx.AsyncClient,
    method: str,
    path: str,
    headers: dict[str, str],
    params: dict[str, str] | None = None,
) -> httpx.Response:
    if path.startswith("/v1/sandboxes/") and "/files" in path:
        params = {**(params or {}), "path": "answer.txt"}
    if (method, path) == ("POST", "/v1/experiments/upload"):
        spec = json.dumps({k: v for k, v in EXPERIMENT.items() if k != "dataset"})
        rows = "".join(json.dumps(row) + "\n" for row in EXPERIMENT["dataset"]["rows"])
        files = {"dataset": ("rows.jsonl", rows.encode(), "application/x-ndjson")}
        return await client.request(
            method, path, data={"spec": spec}, files=files, headers=headers, params=params
        )
    body = body_of(method, path)
    return await client.request(method, path, json=body, headers=headers, params=params)


async def test_every_operation_but_the_public_ones_needs_a_valid_key(
    keyed_settings: Settings,
    keyed_client: httpx.AsyncClient,
    sessions: Sessions,
    tenant_keys: TenantKeys,
) -> None:
    task_id = await a_task_with_everything(keyed_client, sessions, tenant_keys.a)
    experiment_id = await an_experiment(keyed_client, tenant_keys.a)
    subscribed = await call(keyed_client, "POST", "/v1/webhooks", bearer(tenant_keys.a))
    assert subscribed.status_code == 201, subscribed.text
    ops = operations(keyed_settings)
    assert ("POST", "/v1/tasks/{task_id}/cancel") in ops
    assert ("GET", "/v1/tasks/{task_id}/events") in ops
    for method, template in ops:
        path = fill(template, task_id, experiment_id, subscribed.json()["id"])
        if (method, template) in PUBLIC:
            assert (await call(keyed_client, method, path, {})).status_code < 500
            continue
        assert template.startswith("/v1/"), f"{method} {template} is neither /v1 nor public"
        for name, headers in bad_credentials(tenant_keys).items():
            params = {"token": tenant_keys.a} if name == "token in the query" else None
            response = await call(keyed_client, method, path, headers, params)
            error = assert_error(response, 401, "unauthorized")
            assert tenant_keys.a not in response.text, (method, path, name)
            assert error["message"], (method, path, name)
        ok = await call(keyed_client, method, path, bearer(tenant_keys.a))
        assert ok.status_code in passing(method, template), (method, path, ok.text)
    assert (await keyed_client.get("/v1/tasks", headers=bearer(tenant_keys.a))).status_code == 200


def passing(method: str, template: str) -> tuple[int, ...]:
    """What a valid key gets from an operation here (no worker runs in these tests)."""
    if (method, template) in (("POST", "/v1/episodes"), ("POST", "/v1/sandboxes")):
        return (503,)  # let through, then: no worker to open or start it
    if "{episode_id}" in template or "{sandbox_id}" in template:
        return (404,)  # let through to an episode or a sandbox that does not exist
    if "{webhook_id}" in template:
        return (200, 204, 404)  # the subscription (gone once its DELETE came first)
    if "{delivery_id}" in template:
        return (404,)  # let through to a delivery that does not exist
    if template == "/v1/images/builds":
        return (200, 403)  # let through: builds are off on this server
    if "{name}" in template:
        return (404,)  # let through to an image build that does not exist
    return (200, 201, 202, 204, 409)


def needs_tenant(dependant: Any) -> bool:
    """Whether `current_tenant` is among a route's dependencies, however deep."""
    return any(dep.call is current_tenant or needs_tenant(dep) for dep in dependant.dependencies)


async def test_every_route_is_either_public_or_behind_a_key(keyed_settings: Settings) -> None:
    ops = set(operations(keyed_settings))
    assert {op for op in ops if not op[1].startswith("/v1/")} <= PUBLIC
    websocket_routes = set()
    for route in (route for router in ROUTERS for route in router.routes):
        if isinstance(route, APIWebSocketRoute):
            websocket_routes.add(route.path)  # checks its key itself: tested live below
            continue
        assert isinstance(route, APIRoute)
        if route.path.startswith("/v1/"):
            assert needs_tenant(route.dependant), route.path
        else:
            assert route.path in PUBLIC_PATHS, f"{route.path} is public: add it to PUBLIC_PATHS?"
    assert websocket_routes == {
        "/v1/tasks/{task_id}/stream",
        "/v1/experiments/{experiment_id}/stream",
        "/v1/openenv/ws",  # refuses at the handshake: tests/episodes/test_openenv.py and below
    }


async def test_a_multipart_submission_needs_a_key_too(
    keyed_client: httpx.AsyncClient, tenant_keys: TenantKeys
) -> None:
    files = {"task": (None, '{"prompt": "x"}'), "data.txt": ("data.txt", b"1 2 3")}
    refused = await keyed_client.post("/v1/tasks", files=files)
    assert_error(refused, 401, "unauthorized")
    accepted = await keyed_client.post("/v1/tasks", files=files, headers=bearer(tenant_keys.a))
    assert accepted.status_code == 202, accepted.text


async def read_close(url: str, **options: Any) -> tuple[list[str], int | None]:
    """(messages, close code) of a WebSocket until the server closes it."""
    messages: list[str] = []
    async with asyncio.timeout(WAIT_S), websockets.connect(url, **options) as ws:
        try:
            while True:
                messages.append(str(await ws.recv()))
        except websockets.ConnectionClosed:
            pass
        return messages, ws.close_code


async def test_websocket_and_sse_refuse_missing_bad_and_revoked_keys(
    keyed_settings: Settings, sessions: Sessions, tenant_keys: TenantKeys
) -> None:
    async with live_server(keyed_settings) as live:
        async with httpx.AsyncClient(base_url=live.base_url) as client:
            task_id = await a_task_with_everything(client, sessions, tenant_keys.a)
            for name, headers in bad_credentials(tenant_keys).items():
                sse = await client.get(f"/v1/tasks/{task_id}/events", headers=headers)
                assert_error(sse, 401, "unauthorized")
                if name == "token in the query":
                    continue
                header_only = f"{live.ws_url}/v1/tasks/{task_id}/stream"
                assert await read_close(header_only, additional_headers=headers) == ([], 4401), name
            for token in ("", "garbage", tenant_keys.revoked, tenant_keys.a[:-1] + "!"):
                url = f"{live.ws_url}/v1/tasks/{task_id}/stream?token={token}"
                assert await read_close(url) == ([], 4401), token
            good = f"{live.ws_url}/v1/tasks/{task_id}/stream?token={tenant_keys.a}"
            async with asyncio.timeout(WAIT_S), websockets.connect(good) as ws:
                first = await ws.recv()
            assert '"task.queued"' in str(first)
            # An experiment's stream checks its key the same way.
            exp_id = await an_experiment(client, tenant_keys.a)
            for name, headers in bad_credentials(tenant_keys).items():
                sse = await client.get(f"/v1/experiments/{exp_id}/events", headers=headers)
                assert_error(sse, 401, "unauthorized")
                if name == "token in the query":
                    continue
                header_only = f"{live.ws_url}/v1/experiments/{exp_id}/stream"
                assert await read_close(header_only, additional_headers=headers) == ([], 4401), name
            for token in ("", "garbage", tenant_keys.revoked):
                url = f"{live.ws_url}/v1/experiments/{exp_id}/stream?token={token}"
                assert await read_close(url) == ([], 4401), token
            good = f"{live.ws_url}/v1/experiments/{exp_id}/stream?token={tenant_keys.a}"
            async with asyncio.timeout(WAIT_S), websockets.connect(good) as ws:
                first = await ws.recv()
            assert '"item.started"' in str(first)
            # OpenEnv's session refuses before the upgrade: an HTTP 401, no socket.
            for token in ("", "garbage", tenant_keys.revoked):
                url = f"{live.ws_url}/v1/openenv/ws?token={token}"
                with pytest.raises(websockets.InvalidStatus) as refused:
                    await websockets.connect(url)
                assert refused.value.response.status_code == 401, token


async def test_another_tenants_ids_answer_exactly_like_unknown_ones(
    keyed_settings: Settings,
    keyed_client: httpx.AsyncClient,
    sessions: Sessions,
    tenant_keys: TenantKeys,
) -> None:
    a_task = await a_task_with_everything(keyed_client, sessions, tenant_keys.a)
    an_exp = await an_experiment(keyed_client, tenant_keys.a)
    unknown = "tsk_01JZZZZZZZZZZZZZZZZZZZZZZZ"
    for method, template in operations(keyed_settings):
        if "{experiment_id}" in template:
            theirs, none = fill(template, "", an_exp), fill(template, "")
            own, absent = an_exp, UNKNOWN_EXPERIMENT
        elif "{task_id}" in template:
            theirs, none = fill(template, a_task), fill(template, unknown)
            own, absent = a_task, unknown
        else:
            continue
        foreign = await call(keyed_client, method, theirs, bearer(tenant_keys.b))
        missing = await call(keyed_client, method, none, bearer(tenant_keys.b))
        assert_error(foreign, 404, "not_found")
        assert foreign.status_code == missing.status_code, template
        assert foreign.text.replace(own, "ID") == missing.text.replace(absent, "ID"), template
        assert "tenant-a" not in foreign.text
    # A still sees all of it: the 404s above are about tenants, not broken routes.
    mine = await keyed_client.get(
        f"/v1/tasks/{a_task}/artifacts.zip", headers=bearer(tenant_keys.a)
    )
    assert mine.status_code == 200


async def test_lists_cursors_and_idempotency_keys_stay_within_the_tenant(
    keyed_client: httpx.AsyncClient, tenant_keys: TenantKeys
) -> None:
    a, b = bearer(tenant_keys.a), bearer(tenant_keys.b)
    a_ids = []
    for _ in range(3):
        response = await keyed_client.post("/v1/tasks", json=TASK, headers=a)
        a_ids.append(response.json()["id"])
    listed = (await keyed_client.get("/v1/tasks", headers=b)).json()
    assert listed == {"items": [], "next_cursor": None}
    page = (await keyed_client.get("/v1/tasks", params={"limit": 1}, headers=a)).json()
    assert page["next_cursor"]
    after = await keyed_client.get("/v1/tasks", params={"cursor": page["next_cursor"]}, headers=b)
    assert after.json()["items"] == []
    # One Idempotency-Key, two tenants: two tasks; a repeat within a tenant: the first.
    key = {"Idempotency-Key": "same-key"}
    first_a = await keyed_client.post("/v1/tasks", json=TASK, headers={**a, **key})
    first_b = await keyed_client.post("/v1/tasks", json=TASK, headers={**b, **key})
    again_a = await keyed_client.post("/v1/tasks", json=TASK, headers={**a, **key})
    assert (first_a.status_code, first_b.status_code, again_a.status_code) == (202, 202, 200)
    assert first_a.json()["id"] != first_b.json()["id"]
    assert again_a.json()["id"] == first_a.json()["id"]
    assert all(re.fullmatch(r"tsk_[0-9A-HJKMNP-TV-Z]{26}", task_id) for task_id in a_ids)


async def test_websocket_of_another_tenant_closes_like_an_unknown_task(
    keyed_settings: Settings, sessions: Sessions, tenant_keys: TenantKeys
) -> None:
    async with live_server(keyed_settings) as live:
        async with httpx.AsyncClient(base_url=live.base_url) as client:
            a_task = await a_task_with_everything(client, sessions, tenant_keys.a)
        for task_id in (a_task, "tsk_01JZZZZZZZZZZZZZZZZZZZZZZZ"):
            url = f"{live.ws_url}/v1/tasks/{task_id}/stream?token={tenant_keys.b}"
            assert await read_close(url) == ([], 4404)


async def test_the_admin_key_acts_as_the_tenant_it_names(
    keyed_client: httpx.AsyncClient, sessions: Sessions, tenant_keys: TenantKeys
) -> None:
    a_task = await a_task_with_everything(keyed_client, sessions, tenant_keys.a)
    admin = bearer(ADMIN_KEY)
    as_a = await keyed_client.get(
        f"/v1/tasks/{a_task}", headers={**admin, "X-Sandhive-Tenant": "tenant-a"}
    )
    assert as_a.status_code == 200
    as_admin = await keyed_client.get(f"/v1/tasks/{a_task}", headers=admin)
    assert_error(as_admin, 404, "not_found")
    bad = await keyed_client.get("/v1/tasks", headers={**admin, "X-Sandhive-Tenant": "../x"})
    assert_error(bad, 422, "invalid_input")
    # The tenant header means nothing to an ordinary key.
    b_as_a = await keyed_client.get(
        f"/v1/tasks/{a_task}", headers={**bearer(tenant_keys.b), "X-Sandhive-Tenant": "tenant-a"}
    )
    assert_error(b_as_a, 404, "not_found")


async def test_a_revoked_key_stops_working_at_once(
    keyed_client: httpx.AsyncClient, sessions: Sessions
) -> None:
    created = await keys.create_key(sessions, "tenant-c")
    assert (await keyed_client.get("/v1/tasks", headers=bearer(created.key))).status_code == 200
    await keys.revoke_key(sessions, created.id)
    assert_error(
        await keyed_client.get("/v1/tasks", headers=bearer(created.key)), 401, "unauthorized"
    )


@pytest.mark.parametrize("origin", ["https://evil.example", "null"])
async def test_a_foreign_origin_is_refused_at_the_websocket_handshake(
    keyed_settings: Settings, sessions: Sessions, tenant_keys: TenantKeys, origin: str
) -> None:
    async with live_server(keyed_settings) as live:
        async with httpx.AsyncClient(base_url=live.base_url) as client:
            task_id = await a_task_with_everything(client, sessions, tenant_keys.a)
        url = f"{live.ws_url}/v1/tasks/{task_id}/stream?token={tenant_keys.a}"
        with pytest.raises(InvalidStatus) as refused:
            await read_close(url, origin=origin)
        assert refused.value.response.status_code == 403
        # The API's own origin (the page at /) is always fine.
        async with asyncio.timeout(WAIT_S), websockets.connect(url, origin=live.base_url) as ws:
            assert '"task.queued"' in str(await ws.recv())
