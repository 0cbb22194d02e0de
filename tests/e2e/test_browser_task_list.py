"""The page's task list and comparison in a real headless Chromium, on a real service + worker.

The scripted profile (`SANDHIVE_SCRIPTED_PROFILE=true`, models `demo` and `tour`) plays
the model; tasks are submitted through the API (33 cheap `vanilla` ones, so the list has
a second page, and three sandbox runs). What the page is held to: the list shows status,
duration, steps, model and a short id; searching by prompt text and filtering by status
and by a metadata key reach `GET /v1/tasks` and are kept in the hash (a reload keeps
them); "Load more" pages past the first 30; two ticked tasks open side by side with their
steps aligned by number and their answers diffed; an input file over the limit that
`GET /v1/limits` publishes is refused in the form before anything is uploaded, in KiB;
and a 422's message and located details are shown. Screenshots go outside the repository.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import FilePayload, Page, expect, sync_playwright

from app.config import Settings
from app.scripted import DEMO_ANSWER
from app.scripted.profile import TOUR_ANSWER
from tests.support.browser import PHONE, SCREENSHOT_DIR, WAIT_MS, launch, watched_page
from tests.support.processes import Service, running_service

FILE_LIMIT = 64 * 1024
DURATION = re.compile(r"^\d+(\.\d)? (ms|s)$|^\d+ min \d+ s$")
"""A duration as the page writes it: `850 ms`, `4.2 s` or `1 min 3 s`."""
VANILLA = 33


@pytest.fixture
def scripted(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "scripted_profile": True,
            "llm_base_url": "",
            "llm_model": "",
            "max_input_file_bytes": FILE_LIMIT,
        }
    )


@pytest.fixture
def service(scripted: Settings, tmp_path: Path) -> Iterator[Service]:
    with running_service(scripted, tmp_path) as svc:
        yield svc


def submit(base: str, body: dict[str, Any]) -> str:
    response = httpx.post(f"{base}/v1/tasks", json=body, timeout=10)
    assert response.status_code == 202, response.text
    task_id: str = response.json()["id"]
    return task_id


def wait_finished(base: str, ids: list[str]) -> None:
    deadline = time.monotonic() + WAIT_MS / 1000
    pending = set(ids)
    while pending and time.monotonic() < deadline:
        for task_id in list(pending):
            status = httpx.get(f"{base}/v1/tasks/{task_id}", timeout=10).json()["status"]
            if status in ("succeeded", "failed", "cancelled"):
                pending.discard(task_id)
        time.sleep(0.5)
    assert not pending, f"still running: {pending}"


@pytest.fixture
def tasks(service: Service) -> dict[str, Any]:
    """The sandbox runs compared below, one cancelled task, and enough vanilla ones to page."""
    base = service.base_url
    scripted = {"profile": "scripted"}
    made: dict[str, Any] = {
        "cancelled": submit(
            base,
            {
                "prompt": "a tour to cancel",
                "llm": {**scripted, "model": "tour"},
                "metadata": {"team": "ops"},
            },
        ),
    }
    httpx.post(f"{base}/v1/tasks/{made['cancelled']}/cancel", timeout=10)
    made["vanilla"] = [
        submit(
            base,
            {
                "prompt": f"vanilla question {i}",
                "mode": "vanilla",
                "llm": {**scripted, "model": "demo"},
                "metadata": {"batch": "v"},
            },
        )
        for i in range(VANILLA)
    ]
    made["demo"] = submit(
        base,
        {
            "prompt": "Compute the 10th Catalan number",
            "llm": {**scripted, "model": "demo"},
            "metadata": {"team": "math"},
        },
    )
    made["tour"] = submit(
        base,
        {
            "prompt": "Catalan tour with a plot",
            "llm": {**scripted, "model": "tour"},
            "metadata": {"team": "math"},
        },
    )
    experiment = httpx.post(
        f"{base}/v1/experiments",
        json={
            "name": "listed apart",
            "dataset": {
                "rows": [
                    {"id": f"q{i}", "problem_statement": f"sum {i}", "ground_truth": "x"}
                    for i in (1, 2)
                ]
            },
            "arms": [
                {"name": "v", "mode": "vanilla", "task": {"llm": {**scripted, "model": "demo"}}}
            ],
            "scorer": {"kind": "contains"},
        },
        timeout=10,
    )
    assert experiment.status_code == 202, experiment.text
    made["experiment"] = experiment.json()["id"]
    wait_finished(base, [made["cancelled"], made["demo"], made["tour"], *made["vanilla"]])
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:
        items = httpx.get(f"{base}/v1/experiments/{made['experiment']}/items", timeout=10)
        made["experiment_tasks"] = [i["task_id"] for i in items.json()["items"]]
        if all(made["experiment_tasks"]):
            break
        time.sleep(0.3)
    wait_finished(base, made["experiment_tasks"])
    return made


def rows(page: Page) -> Any:
    return page.locator("#task-list > li")


def shot(page: Page, name: str) -> None:
    path = SCREENSHOT_DIR / f"sandhive-task-list-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def test_find_page_compare_and_refuse_an_oversize_file(
    service: Service, tasks: dict[str, Any]
) -> None:
    base = service.base_url
    demo = httpx.get(f"{base}/v1/tasks/{tasks['demo']}").json()
    tour = httpx.get(f"{base}/v1/tasks/{tasks['tour']}").json()
    assert (demo["answer"], tour["answer"]) == (DEMO_ANSWER, TOUR_ANSWER)
    total = VANILLA + 3
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            errors: list[str] = []
            page = watched_page(browser, errors, viewport={"width": 1400, "height": 1000})
            posts: list[str] = []
            page.on(
                "request",
                lambda r: posts.append(r.url) if r.method == "POST" else None,
            )
            page.goto(f"{base}/")

            # the first page: 30 rows, the columns, then "Load more" for the rest
            expect(rows(page)).to_have_count(30)
            first = rows(page).first
            expect(first).to_have_attribute("data-id", tasks["tour"])
            expect(first.locator(".tl-status")).to_have_text("succeeded")
            expect(first.locator(".tl-steps")).to_have_text(f"{tour['usage']['steps']} steps")
            expect(first.locator(".tl-model")).to_have_text("tour")
            expect(first.locator(".tl-id")).to_have_text(tasks["tour"][-8:])
            expect(first.locator(".tl-duration")).to_have_text(DURATION)
            shot(page, "desktop")
            page.click("#load-more")
            expect(rows(page)).to_have_count(total)
            expect(page.locator("#load-more")).to_be_hidden()

            # search by prompt text: the hash keeps it, a reload too
            page.fill("#tl-q", "CATALAN")
            expect(rows(page)).to_have_count(2)
            expect(page).to_have_url(f"{base}/#/?q=CATALAN")
            page.reload()
            expect(page.locator("#tl-q")).to_have_value("CATALAN")
            expect(rows(page)).to_have_count(2)
            ids = [rows(page).nth(i).get_attribute("data-id") for i in range(2)]
            assert ids == [tasks["tour"], tasks["demo"]]
            page.fill("#tl-q", "")

            # status, then a metadata key
            page.select_option("#task-filters select[name=status]", "cancelled")
            expect(rows(page)).to_have_count(1)
            expect(rows(page).first).to_have_attribute("data-id", tasks["cancelled"])
            page.select_option("#task-filters select[name=status]", "")
            page.fill("#task-filters input[name=meta]", "team=math")
            expect(rows(page)).to_have_count(2)
            expect(page).to_have_url(f"{base}/#/?meta=team%3Dmath")
            page.fill("#task-filters input[name=meta]", "batch=v")
            expect(rows(page)).to_have_count(30)
            expect(page.locator("#load-more")).to_be_visible()
            page.click("#load-more")
            expect(rows(page)).to_have_count(VANILLA)
            page.fill("#task-filters input[name=meta]", "team=nobody")
            expect(rows(page)).to_have_count(0)
            expect(page.locator("#task-list-note")).to_have_text("No task matches these filters.")
            page.fill("#task-filters input[name=meta]", "team=math")
            expect(rows(page)).to_have_count(2)

            # experiments' items are apart (not in the counts above), labelled when shown
            page.fill("#task-filters input[name=meta]", "")
            expect(rows(page)).to_have_count(30)
            page.select_option("#task-filters select[name=origin]", "experiments")
            expect(page).to_have_url(f"{base}/#/?origin=experiments")
            for task_id in tasks["experiment_tasks"]:
                expect(page.locator(f"#task-list li[data-id={task_id}]")).to_be_visible()
            expect(rows(page)).to_have_count(2)
            label = rows(page).first.locator(".tl-experiment")
            expect(label).to_have_text(f"exp {tasks['experiment'][-8:]} · v")
            expect(label).to_have_attribute(
                "title",
                re.compile(f"^experiment {tasks['experiment']}, arm v, row q[12], attempt 1$"),
            )
            shot(page, "experiment-items")
            experiment = browser.new_page()  # its page says its numbers are a script's
            experiment.goto(f"{base}/#/experiments/{tasks['experiment']}")
            expect(experiment.locator("#exp-scripted")).to_have_text(
                "Arm v runs the scripted profile: a fixed script, not a model, "
                "so these numbers say nothing about a model."
            )
            experiment.screenshot(path=str(SCREENSHOT_DIR / "sandhive-experiment-scripted.png"))
            experiment.close()
            page.select_option("#task-filters select[name=origin]", "all")
            expect(rows(page)).to_have_count(30)
            page.click("#load-more")
            expect(rows(page)).to_have_count(total + 2)
            page.select_option("#task-filters select[name=origin]", "")
            page.fill("#task-filters input[name=meta]", "team=math")
            expect(rows(page)).to_have_count(2)

            # compare the two runs: steps aligned by number, answers diffed, artifacts
            page.check(f"#task-list li[data-id={tasks['demo']}] .tl-pick")
            expect(page.locator("#compare-selected")).to_be_disabled()
            page.check(f"#task-list li[data-id={tasks['tour']}] .tl-pick")
            page.click("#compare-selected")
            expect(page).to_have_url(f"{base}/#/compare/{tasks['demo']}/{tasks['tour']}")
            steps = page.locator(".cmp-steps tbody tr")
            longest = max(demo["usage"]["steps"], tour["usage"]["steps"])
            expect(steps).to_have_count(longest)
            expect(steps.first.locator("th")).to_have_text("1")
            expect(steps.first.locator("td")).to_have_count(2)
            expect(steps.first.locator("td .cmp-tool").first).to_have_text("execute_bash")
            last = steps.nth(longest - 1).locator("td")
            expect(last.first).to_have_text("—")  # demo has fewer steps: its side is empty
            expect(last.nth(1).locator(".cmp-tool")).to_have_text("submit")
            expect(page.locator(".cmp-answers .del")).to_have_text(f"- {DEMO_ANSWER}")
            expect(page.locator(".cmp-answers .add")).to_have_text(f"+ {TOUR_ANSWER}")
            answer_row = page.locator(".cmp-artifacts tr", has_text="answer.txt")
            expect(answer_row.locator(".cmp-verdict")).to_have_text("differs")
            expect(page.locator(".cmp-facts")).to_contain_text("scripted / tour")
            expect(page.locator("#empty")).to_be_hidden()
            shot(page, "compare")
            phone = browser.new_page(viewport=PHONE)
            phone.goto(f"{base}/#/compare/{tasks['demo']}/{tasks['tour']}")
            expect(phone.locator(".cmp-steps tbody tr")).to_have_count(longest)
            shot(phone, "compare-phone")
            phone.close()

            # an input file over the published limit: refused before any upload, in KiB
            page.goto(f"{base}/#/")
            page.fill("#prompt", "read the big file")
            big: FilePayload = {
                "name": "big.bin",
                "mimeType": "application/octet-stream",
                "buffer": b"x" * (100 * 1024),
            }
            page.set_input_files("#file-input", big)
            error = page.locator("#form-error")
            expect(error).to_contain_text("big.bin is 100 KiB: at most 64 KiB per file")
            posts.clear()
            page.click("#submit")
            expect(error).to_contain_text("Not submitted (nothing was uploaded)")
            expect(error).to_contain_text("100 KiB")
            shot(page, "oversize")
            assert not [url for url in posts if url.endswith("/v1/tasks")], posts

            # a 422 from the server: its message, and each detail with where it is
            page.click("#file-list button")
            page.click(".options summary")
            page.fill("input[name=max_steps]", "0")
            page.fill("input[name=timeout_s]", "0")
            page.click("#submit")
            expect(error).to_contain_text("Not submitted: limits.max_steps:")
            details = error.locator(".api-error-details li")
            expect(details).to_have_count(2)
            expect(details.nth(1).locator("code")).to_have_text("limits.timeout_s")
            shot(page, "error-details")

            # a row opens its task (the list stays, the open one highlighted)
            page.click(f"#task-list a[href='#/tasks/{tasks['demo']}']")
            expect(page.locator("#task-list li.active")).to_have_attribute("data-id", tasks["demo"])
            expect(page.locator("#t-status")).to_have_text("succeeded")
            page.evaluate("location.hash = '#/'")  # back to the list: the filters stay
            expect(page).to_have_url(f"{base}/#/?meta=team%3Dmath")
            expect(page.locator("#task-filters input[name=meta]")).to_have_value("team=math")
            expect(rows(page)).to_have_count(2)
            page.fill("#task-filters input[name=meta]", "team")
            expect(page.locator("#task-list-note")).to_contain_text("write it as key=value")
            assert errors == [], errors
        finally:
            browser.close()
    listed = httpx.get(f"{base}/v1/tasks", params={"q": "big file"}).json()["items"]
    assert listed == [], "nothing was submitted"
