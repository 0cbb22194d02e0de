"""A 405 names, in `Allow`, every method the API takes at that path (RFC 9110), also where
two routes share a path (GET and POST on `/v1/tasks`), and comes in the error shape."""

from __future__ import annotations

import re
from collections.abc import Callable

from app.api.app import create_app
from app.config import Settings
from tests.api.conftest import assert_error, serve


async def test_every_documented_path_answers_405_with_all_of_its_methods(
    make_settings: Callable[..., Settings],
) -> None:
    app = create_app(make_settings())
    paths = app.openapi()["paths"]
    async with serve(app) as client:
        for path, operations in paths.items():
            url = re.sub(r"\{[^}]+\}", "x1", path)
            answer = await client.request("PATCH", url)
            assert_error(answer, 405, "method_not_allowed")
            allowed = set(answer.headers["allow"].replace(" ", "").split(","))
            assert allowed == {m.upper() for m in operations}, path
        nested = await client.request("PATCH", "/v1/tasks/x1/files/a/b/c.txt")  # `anypath`
        assert nested.headers["allow"] == "GET, PUT"
    shared = {path for path, operations in paths.items() if len(operations) > 1}
    assert {"/v1/tasks", "/v1/experiments", "/v1/webhooks"} <= shared
