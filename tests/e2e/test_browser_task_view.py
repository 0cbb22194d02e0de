"""The task view in a real headless Chromium: follow mode, step rail, results first, charts.

A real service and worker with only the built-in scripted profile
(`SANDHIVE_SCRIPTED_PROFILE=true`, no model configured), the page's form
submitting its `tour` model: nine steps with a failing command, edits, a command
printing its progress over four seconds and a PNG artifact. What is held: while
the task runs the running step stays in the viewport; scrolled away, the view
stays put and "jump to live" brings it back; a running command's elapsed time
ticks; once finished the outcome card is above the first step with the answer,
tokens and each artifact linked to the step that wrote it; the rail lists every
step with its exit colour and a click or a `#/tasks/ID/steps/N` link scrolls to
it; the failed-steps filter leaves only the failing step; the waterfall and
token charts hold one bar per step. A second test, with its own script, holds
long observations folded to head and tail and hostile text kept as text.
Screenshots (desktop, mid-run and finished, and a dark phone) go where
tests/e2e/test_browser_page.py writes its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from app.scripted.profile import TOUR_ANSWER, TOUR_IMAGE, TOUR_MODEL
from tests.support.browser import (
    PHONE,
    SCREENSHOT_DIR,
    WAIT_MS,
    assert_no_horizontal_scroll,
    launch,
    watched_page,
)
from tests.support.processes import Service, running_service

TOUR_STEPS = 9
FAILING_INDEX = 2  # the first `python3 /testbed/collatz.py`: NameError, exit 1
PROGRESS_INDEX = 4  # the second run, printing its progress once a second
PLOT_INDEX = 6  # `python3 /testbed/plot.py`, which prints "saved /testbed/output/collatz.png"
ANSWER_INDEX = 7  # creates /testbed/output/answer.txt


@pytest.fixture
def bare(settings: Settings) -> Settings:
    """No real model, the scripted profile on: what `make run` and the README set."""
    return settings.model_copy(
        update={"scripted_profile": True, "llm_base_url": "", "llm_model": ""}
    )


@pytest.fixture
def service(bare: Settings, tmp_path: Path) -> Iterator[Service]:
    with running_service(bare, tmp_path) as svc:
        yield svc


def scroll_y(page: Page) -> float:
    value: float = page.evaluate("window.scrollY")
    return value


def chart_data(page: Page, canvas: str) -> list[list[Any]]:
    """The data of each dataset of the Chart.js chart drawn on `canvas`."""
    data: list[list[Any]] = page.evaluate(
        """(selector) => {
            const chart = Chart.getChart(document.querySelector(selector));
            return chart ? chart.data.datasets.map((d) => d.data) : null;
        }""",
        canvas,
    )
    return data


def painted_pixels(page: Page, canvas: str) -> int:
    count: int = page.evaluate(
        """(selector) => {
            const c = document.querySelector(selector);
            const pixels = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
            let painted = 0;
            for (let i = 3; i < pixels.length; i += 4) if (pixels[i] > 0) painted += 1;
            return painted;
        }""",
        canvas,
    )
    return count


def top_of(page: Page, selector: str) -> float:
    box = page.locator(selector).bounding_box()
    assert box is not None, f"{selector} is not laid out"
    return box["y"]


def wheel_to_the_live_end(page: Page) -> None:
    """A reader's wheel down to the live end: again while steps arriving meanwhile moved the
    end further down (on a loaded machine one turn of the wheel can land short of it)."""
    for _ in range(10):
        page.mouse.wheel(0, 20000)
        page.wait_for_timeout(200)
        if page.locator("#jump-live").is_hidden():
            return


def test_the_task_view_follows_the_live_step_then_puts_results_first(service: Service) -> None:
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            errors: list[str] = []
            page = watched_page(browser, errors, viewport={"width": 1280, "height": 720})
            page.goto(f"{service.base_url}/")
            expect(page.locator("select[name=profile]")).to_have_value("scripted")
            page.fill("#prompt", "Find the longest Collatz chain below 10000 and plot them all.")
            page.click(".options summary")
            page.fill("input[name=model]", TOUR_MODEL)
            page.click("#submit")
            page.wait_for_url("**#/tasks/tsk_*", timeout=WAIT_MS)
            task_id = page.url.rsplit("/", 1)[1]

            # Follow mode: the page grows past the viewport and the running step stays in it.
            third = page.locator(f"li.step[data-index='{FAILING_INDEX}']")
            expect(third).to_be_visible(timeout=WAIT_MS)
            expect(third).to_be_in_viewport()
            assert scroll_y(page) > 0, "the page did not scroll to follow the live step"
            expect(page.locator("#jump-live")).to_be_hidden()

            # Scrolled away (a real wheel), the view stays put and offers to jump back.
            page.mouse.move(1275, 400)  # the page's margin: no inner scroller
            page.mouse.wheel(0, -20000)
            expect(page.locator("#jump-live")).to_be_visible()
            page.wait_for_timeout(1500)  # steps keep arriving meanwhile
            assert scroll_y(page) < 10, "the view pulled the reader back while scrolled away"
            page.click("#jump-live")
            expect(page.locator("#jump-live")).to_be_hidden()
            expect(page.locator("li.step[data-state='running']").last).to_be_in_viewport()
            assert scroll_y(page) > 0

            # The page moving by itself (as scroll anchoring moves it) does not take a reader
            # who left back to the live end; their own wheel down to it does.
            page.mouse.wheel(0, -20000)
            expect(page.locator("#jump-live")).to_be_visible()
            page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
            page.wait_for_timeout(300)
            expect(page.locator("#jump-live")).to_be_visible()
            page.mouse.wheel(0, -200)
            wheel_to_the_live_end(page)
            expect(page.locator("#jump-live")).to_be_hidden()

            # The long-running command: followed, its output live, its elapsed time ticking.
            progress = page.locator(f"li.step[data-index='{PROGRESS_INDEX}']")
            expect(progress.locator("pre.live-output")).to_contain_text(
                "checked  2000", timeout=WAIT_MS
            )
            expect(progress).to_be_in_viewport()
            elapsed = progress.locator(".elapsed")
            expect(elapsed).to_have_text(re.compile(r"^\d+\.\d s$"))
            first_reading = float(elapsed.inner_text().split()[0])
            page.wait_for_function(
                """([selector, before]) => {
                    const node = document.querySelector(selector);
                    return node && parseFloat(node.textContent) > before;
                }""",
                arg=[f"li.step[data-index='{PROGRESS_INDEX}'] .elapsed", first_reading],
                timeout=5000,
            )
            page.screenshot(path=str(SCREENSHOT_DIR / "sandhive-task-view-live.png"))

            # Finished: results first.
            expect(page.locator("#t-status")).to_have_text("succeeded", timeout=WAIT_MS)
            expect(page.locator("#jump-live")).to_be_hidden()
            steps = page.locator("li.step")
            expect(steps).to_have_count(TOUR_STEPS)
            expect(page.locator("li.step .elapsed")).to_have_count(0)
            outcome = page.locator("#outcome")
            expect(outcome).to_be_visible()
            assert top_of(page, "#outcome") < top_of(page, "li.step[data-index='0']")
            expect(outcome.locator("#answer-text")).to_have_text(TOUR_ANSWER)
            expect(outcome.locator("[data-fact=outcome] dd")).to_have_text("succeeded · submitted")
            expect(outcome.locator("[data-fact=steps] dd")).to_have_text(str(TOUR_STEPS))
            expect(outcome.locator("[data-fact=tokens] dd")).to_have_text(
                re.compile(r"^[1-9][\d,]* in · [1-9][\d,]* out$")
            )
            expect(outcome.locator("[data-fact=took] dd")).to_have_text(re.compile(r"\d s$"))
            # The scripted profile has no prices, so no cost.
            expect(outcome.locator("[data-fact=cost]")).to_have_count(0)
            image = outcome.locator(f".outcome-artifacts li[data-path='{TOUR_IMAGE}'] a.writer")
            expect(image).to_have_text(f"written in step {PLOT_INDEX + 1}")
            expect(image).to_have_attribute("href", f"#/tasks/{task_id}/steps/{PLOT_INDEX + 1}")
            answer = outcome.locator(".outcome-artifacts li[data-path='answer.txt'] a.writer")
            expect(answer).to_have_text(f"written in step {ANSWER_INDEX + 1}")

            # The rail: every step, numbered from 1, with its tool and exit colour.
            rail = page.locator("#rail-list .rail-step")
            expect(rail).to_have_count(TOUR_STEPS)
            assert [rail.nth(i).locator(".rail-no").inner_text() for i in range(TOUR_STEPS)] == [
                str(n) for n in range(1, TOUR_STEPS + 1)
            ]
            tools = [rail.nth(i).locator(".rail-tool").inner_text() for i in range(TOUR_STEPS)]
            assert tools == [*"bash create bash edit bash create bash create submit".split()]
            expect(rail.nth(1)).to_have_attribute("data-tool", "str_replace_editor")
            expect(rail.nth(0)).to_have_attribute("data-status", "ok")
            expect(rail.nth(FAILING_INDEX)).to_have_attribute("data-status", "bad")
            expect(rail.nth(0).locator(".rail-time")).to_have_text(re.compile(r"^\d+(\.\d)? m?s$"))
            page.screenshot(path=str(SCREENSHOT_DIR / "sandhive-task-view.png"))

            # A rail click scrolls to its step and links it.
            page.evaluate("window.scrollTo(0, 0)")
            rail.nth(PROGRESS_INDEX).locator("a").click()
            expect(page).to_have_url(re.compile(rf"#/tasks/{task_id}/steps/{PROGRESS_INDEX + 1}$"))
            expect(progress).to_be_in_viewport()
            expect(progress).to_have_class(re.compile(r"\btargeted\b"))
            assert 0 <= top_of(page, f"li.step[data-index='{PROGRESS_INDEX}']") < 200
            expect(page.locator("#rail")).to_be_in_viewport()  # sticky: still there

            # An artifact's step link goes to the step that wrote it.
            page.evaluate("window.scrollTo(0, 0)")
            image.click()
            expect(page.locator(f"li.step[data-index='{PLOT_INDEX}']")).to_be_in_viewport()
            expect(page.locator(f"li.step[data-index='{PLOT_INDEX}'] pre.output")).to_contain_text(
                f"saved /testbed/output/{TOUR_IMAGE}"
            )

            # The failed-steps filter: only the failing command is left, in steps and rail.
            page.evaluate("window.scrollTo(0, 0)")
            expect(page.locator("#failed-count")).to_have_text("(1)")
            page.check("#failed-only")
            expect(page.locator("li.step:visible")).to_have_count(1)
            expect(page.locator(f"li.step[data-index='{FAILING_INDEX}']")).to_be_visible()
            expect(third.locator(".obs-head .exit")).to_have_text("exit 1")
            expect(page.locator("#rail-list .rail-step:visible")).to_have_count(1)
            page.uncheck("#failed-only")
            expect(page.locator("li.step:visible")).to_have_count(TOUR_STEPS)

            # Timing you can see: one model and one tool bar per step, one token bar each.
            model, tool = chart_data(page, "#waterfall-chart")
            assert len(model) == len(tool) == TOUR_STEPS
            for (m_start, m_end), (t_start, t_end) in zip(model, tool, strict=True):
                assert 0 <= m_start <= m_end == t_start <= t_end
            assert model[1][0] > model[0][0], "step 2 starts after step 1"
            assert tool[PROGRESS_INDEX][1] - tool[PROGRESS_INDEX][0] > 3, tool  # ~4 s printing
            prompt, completion = chart_data(page, "#tokens-chart")
            assert len(prompt) == len(completion) == TOUR_STEPS
            assert all(n > 0 for n in prompt + completion), (prompt, completion)
            assert prompt[-1] > prompt[0], "the context grows step by step"
            assert painted_pixels(page, "#waterfall-chart") > 1000
            assert painted_pixels(page, "#tokens-chart") > 1000

            # A link to one step, opened fresh, lands on it (on a dark phone).
            phone = watched_page(
                browser, errors, viewport=PHONE, is_mobile=True, color_scheme="dark"
            )
            phone.goto(f"{service.base_url}/#/tasks/{task_id}/steps/{ANSWER_INDEX + 1}")
            expect(phone.locator("#t-status")).to_have_text("succeeded", timeout=WAIT_MS)
            target = phone.locator(f"li.step[data-index='{ANSWER_INDEX}']")
            expect(target).to_have_class(re.compile(r"\btargeted\b"))
            expect(target).to_be_in_viewport()
            phone.wait_for_timeout(500)  # the charts and the outcome above it are drawn by now
            assert 60 < top_of(phone, f"li.step[data-index='{ANSWER_INDEX}']") < 250
            expect(phone.locator("#rail")).to_be_in_viewport()
            expect(phone.locator("#rail-list .rail-step")).to_have_count(TOUR_STEPS)
            assert_no_horizontal_scroll(phone)
            phone.screenshot(path=str(SCREENSHOT_DIR / "sandhive-task-view-phone.png"))
            phone.evaluate("window.scrollTo(0, 0)")
            expect(phone.locator("#outcome")).to_be_in_viewport()
            assert_no_horizontal_scroll(phone)
            assert errors == []
        finally:
            browser.close()
    print(f"\nscreenshots of the task view: {SCREENSHOT_DIR}/sandhive-task-view*.png")


HOSTILE = (
    '<img src=x onerror="document.body.dataset.owned=1">'
    "<script>document.body.dataset.owned=2</script>"
)
LONG_MODEL = "task-view-long"
LONG_SCRIPT = Script(
    turns=[
        Turn(
            tool="execute_bash",
            arguments={"command": f"seq 1 300; echo '{HOSTILE}'"},
            content=f"Printing a lot, and something nasty: {HOSTILE}",
        ),
        Turn(tool="submit", arguments={}, content="Done.", expect="300"),
    ]
)


@pytest.fixture
def scripted_service(
    settings: Settings, tmp_path: Path, scripted_llm: ScriptedLLMServer
) -> Iterator[Service]:
    scripted_llm.add_script(LONG_MODEL, LONG_SCRIPT)
    with running_service(settings, tmp_path) as svc:
        yield svc


def test_long_observations_fold_to_head_and_tail_and_hostile_text_stays_text(
    scripted_service: Service, scripted_llm: ScriptedLLMServer
) -> None:
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            errors: list[str] = []
            page = watched_page(browser, errors)
            page.goto(f"{scripted_service.base_url}/")
            page.fill("#prompt", "Print a lot.")
            page.click(".options summary")
            page.fill("input[name=model]", LONG_MODEL)
            page.click("#submit")
            expect(page.locator("#t-status")).to_have_text("succeeded", timeout=WAIT_MS)

            output = page.locator("li.step[data-index='0'] pre.output")
            expect(output).to_have_attribute("data-folded", "true")
            text = output.inner_text()
            assert "\n1\n2\n3\n" in text, text[:200]  # the head
            assert HOSTILE in text  # the tail, as text
            assert "\n30\n" not in text  # the middle is left out, and says how much
            hidden = re.search(r"… (\d+) more lines …", text)
            assert hidden is not None, text
            show_all = page.locator("li.step[data-index='0'] button.show-all")
            expect(show_all).to_have_text(re.compile(r"^Show all \d+ lines$"))
            total = int(show_all.inner_text().split()[2])
            assert total > 40
            assert int(hidden[1]) == total - 24, (total, hidden[1])  # 12 + 12 kept
            assert len(text.splitlines()) < 30
            show_all.click()
            expect(output).to_have_attribute("data-folded", "false")
            assert "\n30\n" in output.inner_text()
            expect(show_all).to_have_text("Show head and tail only")
            show_all.click()
            expect(output).to_have_attribute("data-folded", "true")

            # Nothing of the model's or the command's text was ever parsed as HTML.
            expect(page.locator("li.step[data-index='0'] details.thought .text")).to_contain_text(
                HOSTILE
            )
            assert page.locator("#task img[src=x]").count() == 0
            assert page.evaluate("document.body.dataset.owned") is None
            assert errors == []
        finally:
            browser.close()
    assert scripted_llm.failures == []
