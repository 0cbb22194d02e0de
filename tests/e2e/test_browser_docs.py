"""`/docs` in a real browser with no internet: every operation shown, and a task submitted.

Debian's `chromium` driven by Playwright, as in the other browser tests
(tests/support/browser.py). Every request to another host is aborted and counted, and any
console error (a CSP refusal is one) fails.
The user's path: Authorize with a key, try POST /v1/tasks with its scripted example, 202.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
from playwright.async_api import Request, Route, async_playwright

from app.config import Settings
from app.db.engine import Sessions
from app.services import keys
from tests.api.live_server import live_server
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, SCREENSHOT_DIR

WAIT_MS = 30_000


async def test_docs_render_every_operation_offline_and_submit_the_example(
    make_settings: Callable[..., Settings], sessions: Sessions
) -> None:
    settings = make_settings(auth="keys", scripted_profile=True)
    key = (await keys.create_key(sessions, "docs-reader")).key
    async with live_server(settings) as server, async_playwright() as playwright:
        spec = await operation_count(server.base_url)
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            elsewhere: list[str] = []
            problems: list[str] = []

            async def local_only(route: Route, request: Request) -> None:
                if request.url.startswith(server.base_url + "/"):
                    await route.continue_()
                else:
                    elsewhere.append(request.url)
                    await route.abort()

            await page.route("**/*", local_only)
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            await page.goto(f"{server.base_url}/docs")
            blocks = page.locator(".opblock")
            await page.locator(".opblock-summary-path[data-path='/v1/tasks']").first.wait_for(
                timeout=WAIT_MS
            )
            assert await blocks.count() == spec, "one block per operation of /openapi.json"
            assert await page.locator("button.authorize").count() == 1, "the bearer scheme"
            await page.locator("#operations-tasks-create_task_v1_tasks_post").click()
            examples = page.locator(".opblock-body .examples-select select").first
            await examples.wait_for(timeout=WAIT_MS)
            assert "scripted" in await examples.inner_text(), "the named request examples"
            await page.locator("button.authorize").click()
            await page.locator(".auth-container input").fill(key)
            await page.locator(".auth-btn-wrapper button.authorize").click()
            await page.locator(".auth-btn-wrapper button.btn-done").click()
            await page.locator("button.try-out__btn").first.click()
            await page.locator("button.execute").first.click()
            status = page.locator(".live-responses-table tr.response .response-col_status").first
            await status.wait_for(timeout=WAIT_MS)
            assert (await status.inner_text()).strip() == "202"
            answer = await page.locator(".live-responses-table tr.response").first.inner_text()
            assert '"id": "tsk_' in answer, answer
            await page.screenshot(path=str(SCREENSHOT_DIR / "sandhive-docs.png"))
        finally:
            await browser.close()
    assert elsewhere == [], "the docs asked another host"
    assert problems == [], problems


async def operation_count(base_url: str) -> int:
    """How many operations the served document has."""
    async with httpx.AsyncClient(timeout=10) as client:
        paths = (await client.get(f"{base_url}/openapi.json")).json()["paths"]
    methods = {"get", "post", "put", "patch", "delete"}
    return sum(1 for item in paths.values() for method in item if method in methods)
