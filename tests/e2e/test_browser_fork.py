"""Forks on the page in a real headless Chromium (docs/fork.md, "The page").

A real service and worker and a scripted task of four steps. On its third step "Fork from
here" asks for two children; the page opens the first, which replays the steps before the
branch in a fresh sandbox and finishes; its family card names the parent and the branch
step and links the compare view, which marks where the child branched; the parent's
family card lists both children under their branch step.
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


@pytest.fixture
def fork_model(scripted_llm: ScriptedLLMServer) -> str:
    """The parent's steps; its children, on the same model, play on from the branch (the
    scripted model picks its turn by the assistant messages already in the history)."""
    model = f"fork-page-{uuid.uuid4().hex[:8]}"
    turns = [
        Turn(tool="execute_bash", arguments={"command": "echo one > /testbed/notes.txt"}),
        Turn(tool="execute_bash", arguments={"command": "echo two >> /testbed/notes.txt"}),
        Turn(tool="execute_bash", arguments={"command": "cat /testbed/notes.txt"}),
        Turn(tool="submit"),
    ]
    scripted_llm.add_script(model, Script(turns=turns))
    return model


@pytest.fixture
def service(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    with running_service(settings, tmp_path) as svc:
        yield svc


def test_fork_from_a_step_then_follow_the_family(service: Service, fork_model: str) -> None:
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            errors: list[str] = []
            page = watched_page(browser, errors)
            page.goto(f"{service.base_url}/")
            page.fill("#prompt", "Write notes, then fork.")
            page.click(".options summary")
            page.fill("input[name=model]", fork_model)
            page.click("#submit")
            expect(page.locator("#t-status")).to_have_text("succeeded", timeout=WAIT_MS)
            parent = page.locator("#t-id").inner_text()
            expect(page.locator("#family")).to_be_hidden()  # no parent, no forks yet

            third = page.locator("li.step[data-index='2']")
            third.get_by_role("button", name="Fork from here").click()
            form = third.locator(".fork-form")
            expect(form.locator("select[name=model] option").first).to_contain_text("this task's")
            form.locator("input[name=n]").fill("2")
            form.get_by_role("button", name="Fork at step 3").click()

            expect(page.locator("#t-id")).not_to_have_text(parent, timeout=WAIT_MS)
            expect(page.locator("#t-status")).to_have_text("succeeded", timeout=WAIT_MS)
            child = page.locator("#t-id").inner_text()
            origin = page.locator("#family-origin")
            expect(origin).to_contain_text(f"Forked from {parent} at step 3")
            expect(page.locator("li.step[data-index='2'] .observation")).to_contain_text("one\ntwo")

            origin.get_by_role("link", name="Compare with the parent").click()
            branch = page.locator(".cmp-branch")
            expect(branch).to_contain_text("B was forked from A here", timeout=WAIT_MS)
            assert page.locator("tr.replayed").count() == 2

            page.goto(f"{service.base_url}/#/tasks/{parent}")
            tree = page.locator("#family-tree")
            expect(tree.locator(".family-step")).to_have_text(["from step 3"], timeout=WAIT_MS)
            expect(tree.locator(".family-child")).to_have_count(2)
            expect(tree.get_by_role("link", name=child)).to_be_visible()
            assert errors == []
        finally:
            browser.close()
