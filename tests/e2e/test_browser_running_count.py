"""The task header's step count of a running task, opened mid-run, in a real headless Chromium.

A running task's stored `usage` is written only when it ends (docs/development.md: the
loop's `Outcome` counts it), so `GET /v1/tasks/{id}` of a running task says `steps: 0`; the
page counts the running task's steps from the `step.completed` events it sees. Opening
`#/tasks/ID` replays `task.started`, which has the page read the task again, then the
completed steps: when that answer came after the replayed steps, the page put the stored 0
back over the count ("steps 0" with steps done), until the next step completed.

A real service and worker; the scripted LLM plays three quick commands, then a long
`sleep`, then submits. The page is opened while the `sleep` runs, with the answers to
`GET /v1/tasks/{id}` held back a moment (a slow network) so that the re-read answer lands
after the replay, every time. Held: the header says "steps 3" and never anything lower from
then on, through the end of the task, whose count is the API's.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Route, expect, sync_playwright

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.support.browser import WAIT_MS, launch, watched_page
from tests.support.processes import Service, running_service

MODEL = "browser-running-count"
QUICK = 3  # quick steps done before the page opens
SLEEP_S = 20  # the step running while the page is open (room for a slow Chromium start)
SCRIPT = Script(
    turns=[
        *(
            Turn(
                tool="execute_bash", arguments={"command": f"echo quick {i}"}, content=f"Step {i}."
            )
            for i in range(QUICK)
        ),
        Turn(tool="execute_bash", arguments={"command": f"sleep {SLEEP_S}"}, content="Wait."),
        Turn(tool="submit", arguments={}, content="Done."),
    ]
)
STEPS = QUICK + 2
HOLD_MS = 1500  # how long the page's answers to GET /v1/tasks/{id} are held back

# Every value the header's "steps" has shown, in order (#t-meta is rebuilt on each render).
RECORD_COUNTS = """
window.stepCounts = [];
document.addEventListener("DOMContentLoaded", () => {
  const meta = document.querySelector("#t-meta");
  const record = () => {
    for (const item of meta.querySelectorAll("div")) {
      const name = item.querySelector("dt");
      if (!name || name.textContent !== "steps") continue;
      const value = item.querySelector("dd").textContent;
      if (window.stepCounts[window.stepCounts.length - 1] !== value) window.stepCounts.push(value);
    }
  };
  const what = { childList: true, subtree: true, characterData: true };
  new MutationObserver(record).observe(meta, what);
});
"""


@pytest.fixture
def scripted_service(
    settings: Settings, tmp_path: Path, scripted_llm: ScriptedLLMServer
) -> Iterator[Service]:
    scripted_llm.add_script(MODEL, SCRIPT)
    with running_service(settings, tmp_path) as svc:
        yield svc


def wait_steps_done(client: httpx.Client, task_id: str, count: int) -> None:
    """Until the task's trajectory holds `count` steps, the task still running."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:
        steps = client.get(f"/v1/tasks/{task_id}/trajectory").json()["steps"]
        if len(steps) >= count:
            assert len(steps) == count, f"the page opened too late: {len(steps)} steps done"
            return
        time.sleep(0.05)
    raise AssertionError(f"{task_id} never completed {count} steps")


def test_a_running_task_opened_mid_run_shows_its_completed_steps_and_never_fewer(
    scripted_service: Service, scripted_llm: ScriptedLLMServer
) -> None:
    base = scripted_service.base_url
    with httpx.Client(base_url=base, timeout=30) as client, sync_playwright() as playwright:
        created = client.post("/v1/tasks", json={"prompt": "Count.", "llm": {"model": MODEL}})
        assert created.status_code == 202, created.text
        task_id = created.json()["id"]
        wait_steps_done(client, task_id, QUICK)  # the `sleep` step runs now

        browser = launch(playwright)
        try:
            errors: list[str] = []
            page = watched_page(browser, errors)
            page.add_init_script(RECORD_COUNTS)
            answered: list[float] = []

            def slow(route: Route) -> None:
                response = route.fetch()
                page.wait_for_timeout(HOLD_MS)
                route.fulfill(response=response)
                answered.append(time.monotonic())

            page.route(re.compile(rf"/v1/tasks/{task_id}$"), slow)
            page.goto(f"{base}/#/tasks/{task_id}")
            steps = page.locator("#t-meta div").filter(has=page.locator("dt", has_text="steps"))
            count = steps.locator("dd")
            last_done = page.locator(f"li.step[data-index='{QUICK - 1}']")
            expect(last_done).to_have_attribute("data-state", "done", timeout=WAIT_MS)
            expect(count).to_have_text(str(QUICK), timeout=WAIT_MS)

            # The page's re-read on the replayed task.started: answered after the replay.
            deadline = time.monotonic() + WAIT_MS / 1000
            while len(answered) < 2 and time.monotonic() < deadline:
                page.wait_for_timeout(50)
            assert len(answered) >= 2, f"the page read the task {len(answered)} times"
            page.wait_for_timeout(1200)  # and the header's clock has re-rendered it since
            shown_now = count.inner_text()  # read first: the checks below only date it
            running = client.get(f"/v1/tasks/{task_id}").json()
            assert running["status"] == "running", running
            trajectory = client.get(f"/v1/tasks/{task_id}/trajectory").json()["steps"]
            assert len(trajectory) == QUICK, "the sleep ended before the check"
            assert shown_now == str(QUICK)

            # To the end: never lower, ending at the API's final count.
            expect(page.locator("#t-status")).to_have_text("succeeded", timeout=WAIT_MS)
            final = client.get(f"/v1/tasks/{task_id}").json()["usage"]["steps"]
            assert final == STEPS
            expect(count).to_have_text(str(STEPS))
            shown: list[str] = page.evaluate("window.stepCounts")
            seen = [int(value) for value in shown[shown.index(str(QUICK)) :]]
            assert seen == sorted(seen), f"the step count went down: {shown}"
            assert errors == []
        finally:
            browser.close()
    assert scripted_llm.failures == []
