"""The page at `/` in a real headless Chromium: submit, watch live, survive an API restart.

Debian's `chromium` driven by Playwright (`executable_path`, never `playwright
install`). API and worker are real subprocesses; the task runs in a real
sandbox, played by the scripted LLM. A screenshot taken mid-task is written
outside the repository and its path printed, so anyone can look at the page.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect, sync_playwright
from pydantic import SecretStr

from app.config import Settings
from app.llm.scripted import Script, ScriptedLLMServer, Turn
from tests.support.processes import Service, running_service, settings_env

CHROMIUM = os.environ.get("SANDHIVE_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT_DIR = Path(os.environ.get("SANDHIVE_SCREENSHOT_DIR", "/tmp"))
WAIT_MS = 90_000
MODEL = "browser-page"

PLOT = """python3 - <<'EOF'
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
xs = [x / 10 for x in range(100)]
fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
ax.plot(xs, [x * x % 7 for x in xs], color="#b7791f")
ax.set_title("a plot made in the sandbox")
fig.tight_layout()
fig.savefig("/testbed/output/plot.png")
print("saved /testbed/output/plot.png")
EOF
cat /testbed/input/numbers.txt"""
TICKS = "for i in 1 2 3 4 5 6 7 8; do echo tick $i; sleep 1; done"
SCRIPT = Script(
    turns=[
        Turn(
            tool="execute_bash",
            arguments={"command": PLOT},
            content="I will plot the curve with matplotlib and save a PNG in /testbed/output.",
            reasoning="A quick plot shows the shape; the PNG becomes an artifact.",
            stream_delay_s=0.05,
        ),
        Turn(
            tool="execute_bash",
            arguments={"command": TICKS},
            content="Now a slow command, so you can watch its output arrive line by line.",
            expect="1 2 3",  # the input file dropped on the page reached the sandbox
            stream_delay_s=0.05,
        ),
        Turn(
            tool="str_replace_editor",
            arguments={
                "command": "create",
                "path": "/testbed/output/answer.txt",
                "file_text": "The plot is in plot.png.",
            },
            content="Writing the answer file.",
            expect="tick 8",
        ),
        Turn(tool="submit", arguments={}, content="Done.", expect="File created"),
    ]
)


@pytest.fixture
def service(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    with running_service(settings, tmp_path) as svc:
        yield svc


@contextmanager
def restarted_api(service: Service, settings: Settings) -> Iterator[subprocess.Popen[bytes]]:
    """Stop the service's API process and start a new one on the same port."""
    service.api.terminate()
    service.api.wait(timeout=20)
    port = service.base_url.rsplit(":", 1)[1]
    with (service.log_dir / "api-restarted.log").open("wb") as log:
        api = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--port", port],
            env=settings_env(settings),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while not ready(service.base_url):
            assert api.poll() is None, service.logs()
            assert time.monotonic() < deadline, service.logs()
            time.sleep(0.2)
        yield api
    finally:
        api.terminate()
        try:
            api.wait(timeout=20)
        except subprocess.TimeoutExpired:
            api.kill()
            api.wait()


def ready(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def submit_through_the_form(page: Page) -> str:
    page.fill("#prompt", "Plot x² mod 7 and count to eight, slowly.")
    page.click(".options summary")
    page.fill("input[name=model]", MODEL)
    page.fill("input[name=max_steps]", "10")
    page.set_input_files(
        "#file-input",
        files=[{"name": "numbers.txt", "mimeType": "text/plain", "buffer": b"1 2 3\n"}],
    )
    expect(page.locator("#file-list")).to_contain_text("numbers.txt")
    page.click("#submit")
    page.wait_for_url("**#/tasks/tsk_*", timeout=WAIT_MS)
    return page.url.rsplit("/", 1)[1]


def test_the_page_runs_a_task_live_and_survives_an_api_restart(
    service: Service, settings: Settings, scripted_llm: ScriptedLLMServer
) -> None:
    scripted_llm.add_script(MODEL, SCRIPT)
    screenshot = SCREENSHOT_DIR / "sandhive-page.png"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(f"{service.base_url}/")
            expect(page).to_have_title("Sandhive")
            task_id = submit_through_the_form(page)

            # Steps appear as they happen: the plot step completes, the counter streams.
            expect(page.locator("li.step[data-index='0'][data-state='done']")).to_be_visible(
                timeout=WAIT_MS
            )
            running = page.locator("li.step[data-index='1'][data-state='running']")
            expect(running.locator("pre.live-output")).to_contain_text("tick 2", timeout=WAIT_MS)
            expect(running.locator("pre.shell")).to_contain_text("for i in")  # shown as it runs
            expect(page.locator("#conn")).to_have_text("live")
            page.screenshot(path=str(screenshot), full_page=True)
            print(f"\nscreenshot of the page mid-task: {screenshot}")

            with restarted_api(service, settings):
                expect(page.locator("#t-status")).to_have_text("succeeded", timeout=WAIT_MS)
                steps = page.locator("li.step")
                expect(steps).to_have_count(4)
                indices = [steps.nth(i).get_attribute("data-index") for i in range(4)]
                assert indices == ["0", "1", "2", "3"]
                expect(page.locator("li.step[data-state='done']")).to_have_count(4)
                expect(page.locator("li.step[data-index='1'] pre.output")).to_contain_text("tick 8")
                expect(page.locator("#answer-text")).to_have_text("The plot is in plot.png.")
                image = page.locator(".artifact[data-path='plot.png'] img")
                expect(image).to_be_visible(timeout=WAIT_MS)
                page.wait_for_function(
                    "img => img.complete && img.naturalWidth === 600", arg=image.element_handle()
                )
                page.screenshot(
                    path=str(SCREENSHOT_DIR / "sandhive-page-finished.png"), full_page=True
                )

                # A fresh visit to the finished task (a phone, in dark mode) replays it all once.
                phone = browser.new_page(
                    viewport={"width": 390, "height": 844}, is_mobile=True, color_scheme="dark"
                )
                phone.on("pageerror", lambda error: errors.append(str(error)))
                phone.goto(f"{service.base_url}/#/tasks/{task_id}")
                expect(phone.locator("#t-status")).to_have_text("succeeded", timeout=WAIT_MS)
                expect(phone.locator("li.step[data-state='done']")).to_have_count(4)
                expect(phone.locator(".artifact[data-path='plot.png'] img")).to_be_visible()
                phone.screenshot(path=str(SCREENSHOT_DIR / "sandhive-page-phone.png"))

            assert errors == []
        finally:
            browser.close()

    assert task_id.startswith("tsk_")
    assert scripted_llm.failures == []


ADMIN_KEY = "browser-test-admin-key"


@pytest.fixture
def keyed_service(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    keyed = settings.model_copy(update={"auth": "keys", "admin_api_key": SecretStr(ADMIN_KEY)})
    with running_service(keyed, tmp_path) as svc:
        yield svc


def test_the_page_asks_for_a_key_and_streams_with_it(
    keyed_service: Service, scripted_llm: ScriptedLLMServer
) -> None:
    scripted_llm.add_script(
        "browser-keyed", Script(turns=[Turn(tool="submit", arguments={}, content="Nothing to do.")])
    )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{keyed_service.base_url}/")
            expect(page.locator("#key-panel")).to_be_visible(timeout=WAIT_MS)  # the list got a 401
            page.fill("#key-input", ADMIN_KEY)
            page.click("#key-panel button[type=submit]")
            expect(page.locator("#key-toggle")).to_have_text("API key ✓")
            page.fill("#prompt", "Nothing, really.")
            page.click(".options summary")
            page.fill("input[name=model]", "browser-keyed")
            page.click("#submit")
            # The WebSocket carries the key as ?token=: without it the stream would close 4401.
            expect(page.locator("#t-status")).to_have_text("succeeded", timeout=WAIT_MS)
            expect(page.locator("li.step[data-state='done']")).to_have_count(1)
            assert page.evaluate("localStorage.getItem('sandhive.apiKey')") == ADMIN_KEY
        finally:
            browser.close()
