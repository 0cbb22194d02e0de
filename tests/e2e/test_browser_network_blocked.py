"""A refused connection in the page (issue 18): the task view's step rail names each host the
egress proxy refused, while the task runs and again when the finished task is opened afresh.

Real Chromium, API, worker, egress proxy and upstreams (the fixtures of
tests/security/test_egress_domains.py); the scripted LLM plays a task allowed `good.test`
that also tries `a.ok.test` (on the operator's list, not the task's) and `other.test`
(plain HTTP). Held: one `network blocked: <host>` entry per refusal, after the step that made
it, with the proxy's reason as its title, none for the allowed name; shown while the task
is still running, neither doubled by the page's own reloads nor lost on a fresh load. A
screenshot goes where tests/e2e/test_browser_page.py writes its own.
"""

from __future__ import annotations

import httpx
from playwright.sync_api import Page, expect, sync_playwright

from app.scripted import Script, ScriptedLLMServer, Turn
from tests.security.test_egress_domains import Proxied, service, submit, upstream
from tests.security.test_sandbox_attacks import observations, wait_removed
from tests.support.browser import SCREENSHOT_DIR, WAIT_MS, launch, watched_page

__all__ = ["service", "upstream"]  # the egress fixtures, used here by name

MODEL = "browser-network-blocked"
FETCH = (
    "curl -sS --max-time 15 https://good.test/page; "
    "curl -sS --max-time 15 -o /dev/null -w 'default=%{http_code}\\n' https://a.ok.test/; "
    "curl -sS --max-time 15 -o /dev/null -w 'other=%{http_code}\\n' http://other.test/"
)
SCRIPT = Script(
    turns=[
        Turn(tool="execute_bash", arguments={"command": FETCH}),
        Turn(tool="execute_bash", arguments={"command": "sleep 6"}),  # still running meanwhile
        Turn(tool="submit"),
    ]
)
BLOCKED = ["network blocked: a.ok.test", "network blocked: other.test"]
SCREENSHOT = SCREENSHOT_DIR / "sandhive-task-view-network-blocked.png"


def rail(page: Page) -> list[str]:
    """The rail's entries in order: a step as `step N`, anything else as its text."""
    entries: list[str] = page.evaluate(
        """() => [...document.querySelectorAll("#rail-list > li")].map((li) =>
            li.classList.contains("rail-step") ? `step ${li.dataset.index * 1 + 1}`
                                               : li.textContent)"""
    )
    return entries


def assert_blocked_shown(page: Page) -> None:
    """Both refusals in the rail, once each, after step 1 (which made them), with a reason."""
    blocked = page.locator("#rail-list .rail-blocked")
    expect(blocked).to_have_count(2, timeout=WAIT_MS)
    expect(blocked.first).to_be_visible()
    assert blocked.all_inner_texts() == BLOCKED  # in the order the proxy refused them
    for title in [blocked.nth(i).get_attribute("title") for i in range(2)]:
        assert title, "a refusal without the proxy's reason"
    entries = rail(page)
    assert entries[0] == "step 1", entries
    assert entries.index("step 1") < min(entries.index(text) for text in BLOCKED), entries
    assert not any("good.test" in text for text in entries), entries


def test_the_page_shows_each_refused_host_live_and_after_a_reload(
    service: Proxied, scripted_llm: ScriptedLLMServer
) -> None:
    scripted_llm.add_script(MODEL, SCRIPT)
    sandbox = {"network": "egress", "allow_domains": ["good.test"], "memory_mb": 256}
    with httpx.Client(base_url=service.svc.base_url, timeout=30) as client:
        created = submit(client, sandbox, model=MODEL)
        assert created.status_code == 202, created.text
        task_id = created.json()["id"]
        with sync_playwright() as playwright:
            browser = launch(playwright)
            try:
                errors: list[str] = []
                page = watched_page(browser, errors, viewport={"width": 1280, "height": 720})
                page.goto(f"{service.svc.base_url}/#/tasks/{task_id}")

                # Live: the refusals show up while the task still runs (its `sleep 6` step).
                expect(page.locator("#rail-list .rail-blocked")).to_have_count(2, timeout=WAIT_MS)
                expect(page.locator("#t-status")).to_have_text("running", timeout=1000)
                assert_blocked_shown(page)
                page.locator("#rail-list .rail-blocked").last.scroll_into_view_if_needed()
                page.screenshot(path=str(SCREENSHOT))

                # Finished (the page reloads the task itself): still each refusal once.
                expect(page.locator("#t-status")).to_have_text("succeeded", timeout=WAIT_MS)
                expect(page.locator("#rail-list .rail-step")).to_have_count(3)
                assert_blocked_shown(page)

                # Opened afresh: replayed from the stored events.
                page.reload()
                expect(page.locator("#t-status")).to_have_text("succeeded", timeout=WAIT_MS)
                expect(page.locator("#rail-list .rail-step")).to_have_count(3, timeout=WAIT_MS)
                assert_blocked_shown(page)
                assert errors == []
            finally:
                browser.close()
        seen = observations(client, task_id)[0]
        assert "hello good.test /page" in seen, seen  # the allowed name was reached
        assert "default=000" in seen, seen
        assert "other=403" in seen, seen
    assert scripted_llm.failures == []
    wait_removed(task_id)
    print(f"\nscreenshot of a refused connection in the task view: {SCREENSHOT}")
