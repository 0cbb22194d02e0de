"""The task view's Files panel in a real headless Chromium (docs/files.md, "The page").

A real service and worker and a scripted task that writes a few files (one named and
filled like an HTML injection) and then sleeps: while it runs the panel lists the
workdir, opens a directory and shows a text file, all as text; once the task is
cancelled the panel goes away.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.support.browser import WAIT_MS, launch, watched_page
from tests.support.processes import Service, running_service

HOSTILE = "<img src=x onerror=document.body.dataset.owned=1>"
SETUP = (
    "mkdir -p output && printf 'forty-two\\n' > output/answer.txt"
    f" && printf '%s' '{HOSTILE}' > 'output/{HOSTILE.replace('/', '')}'"
)


@pytest.fixture
def files_model(scripted_llm: ScriptedLLMServer) -> str:
    model = f"files-page-{uuid.uuid4().hex[:8]}"
    turns = [
        Turn(tool="execute_bash", arguments={"command": SETUP}),
        Turn(tool="execute_bash", arguments={"command": "sleep 600"}),
        Turn(tool="submit"),
    ]
    scripted_llm.add_script(model, Script(turns=turns))
    return model


@pytest.fixture
def service(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    with running_service(settings, tmp_path) as svc:
        yield svc


def test_the_files_panel_browses_a_running_task(service: Service, files_model: str) -> None:
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            errors: list[str] = []
            page = watched_page(browser, errors)
            page.goto(f"{service.base_url}/")
            page.fill("#prompt", "Write files, then wait.")
            page.click(".options summary")
            page.fill("input[name=model]", files_model)
            page.click("#submit")
            expect(page.locator("#t-status")).to_have_text("running", timeout=WAIT_MS)

            panel = page.locator("#files")
            expect(panel).to_be_visible(timeout=WAIT_MS)
            expect(page.locator("#files-path")).to_have_text("/testbed")
            output = panel.locator("li[data-name=output] button")
            # The setup command may still be running when the panel first lists.
            for _ in range(50):
                if output.count():
                    break
                panel.get_by_role("button", name="Refresh").click()
                page.wait_for_timeout(200)
            output.click()
            expect(page.locator("#files-path")).to_have_text("/testbed/output")
            answer = panel.locator("li[data-name='answer.txt'] button")
            expect(answer).to_be_visible()
            answer.click()
            expect(page.locator("#files-view")).to_have_text("forty-two\n")
            hostile = panel.locator("li button", has_text="onerror")
            expect(hostile).to_have_text(HOSTILE.replace("/", ""))
            hostile.click()
            expect(page.locator("#files-view")).to_have_text(HOSTILE)
            assert page.locator("#task img[src=x]").count() == 0
            assert page.evaluate("document.body.dataset.owned") is None

            page.click("#cancel")
            expect(page.locator("#t-status")).to_have_text("cancelled", timeout=WAIT_MS)
            expect(panel).to_be_hidden()
            assert errors == []
        finally:
            browser.close()
