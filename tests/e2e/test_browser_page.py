"""The page at `/` in a real headless Chromium: submit, watch live, survive an API restart.

Debian's `chromium` driven by Playwright (`executable_path`, never `playwright
install`). API and worker are real subprocesses; the task runs in a real
sandbox, played by the scripted LLM. A screenshot taken mid-task is written
outside the repository and its path printed, so anyone can look at the page.

What the page is held to: an input file dropped on the drop zone (a real
`drop` event) and one picked with the file input reach the sandbox; the form's
LLM profile, model, tool profile and limits reach the task; the task list
follows the status; each step shows its reasoning (collapsed), its command as
code or its edit as a diff, its exit code, timings and tokens; PNG and SVG
artifacts render as images and HTML in a sandboxed frame, with sizes and a zip
of all; the page reconnects by itself across an API restart without
duplicating steps; the cancel button cancels; a phone never scrolls sideways.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, FilePayload, Page, expect, sync_playwright
from pydantic import SecretStr

from app.config import Settings
from app.scripted import Script, ScriptedLLMServer, Turn
from tests.support.browser import (
    PHONE,
    SCREENSHOT_DIR,
    WAIT_MS,
    assert_no_horizontal_scroll,
    launch,
    watched_page,
)
from tests.support.processes import Service, running_service, settings_env

MODEL = "browser-page"
PROFILE = "scripted"  # an LLM profile from a TOML file, so the form's choice is visible

DROPPED = ("numbers.txt", "1 2 3 dropped on the page\n")
PICKED = ("words.txt", "picked with the file input\n")
SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" width="160" height="90" viewBox="0 0 160 90">'
    '<rect width="160" height="90" rx="8" fill="#fdf3e1"/>'
    '<circle cx="45" cy="45" r="30" fill="#b7791f"/></svg>\n'
)
HTML = (
    "<!doctype html><title>report</title><h1>Sandbox report</h1>"
    '<script>document.body.dataset.ran = "yes"</script>\n'
)
ANSWER = "The plot is in plot.png."
EDITED = "The plot is in plot.png; the shape is in shape.svg."

PLOT = (
    """python3 - <<'EOF'
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
cat > /testbed/output/shape.svg <<'EOF'
"""
    + SVG
    + """EOF
cat > /testbed/output/report.html <<'EOF'
"""
    + HTML
    + """EOF
cat /testbed/input/numbers.txt /testbed/input/words.txt"""
)
TICKS = "for i in 1 2 3 4 5 6 7 8; do echo tick $i; sleep 1; done; (exit 3)"
REASONING = "A quick plot shows the shape; the PNG becomes an artifact."
SCRIPT = Script(
    turns=[
        Turn(
            tool="execute_bash",
            arguments={"command": PLOT},
            content="I will plot the curve with matplotlib and save a PNG in /testbed/output.",
            reasoning=REASONING,
            stream_delay_s=0.05,
        ),
        Turn(
            tool="execute_bash",
            arguments={"command": TICKS},
            content="Now a slow command, so you can watch its output arrive line by line.",
            expect=DROPPED[1].strip(),  # the input file dropped on the page reached the sandbox
            stream_delay_s=0.05,
        ),
        Turn(
            tool="str_replace_editor",
            arguments={
                "command": "create",
                "path": "/testbed/output/answer.txt",
                "file_text": ANSWER,
            },
            content="Writing the answer file.",
            expect="tick 8",
        ),
        Turn(
            tool="str_replace_editor",
            arguments={
                "command": "str_replace",
                "path": "/testbed/output/answer.txt",
                "old_str": "plot.png.",
                "new_str": "plot.png; the shape is in shape.svg.",
            },
            content="Mentioning the shape too.",
            expect="File created",
        ),
        Turn(tool="submit", arguments={}, content="Done.", expect="answer.txt"),
    ]
)
CANCEL_MODEL = "browser-cancel"
CANCEL_SCRIPT = Script(
    turns=[
        Turn(
            tool="execute_bash",
            arguments={"command": "echo waiting to be cancelled; sleep 600"},
            content="This will take a while.",
        ),
        Turn(tool="submit", arguments={}, content="Not reached."),
    ]
)
# A completed step's meta line: model time, tool time, then prompt → completion tokens.
STEP_META = re.compile(
    r"^model \d+(\.\d)? m?s · tool \d+(\.\d)? m?s · [1-9][\d,]* → [1-9][\d,]* tokens$"
)


@pytest.fixture
def page_settings(settings: Settings, tmp_path: Path, scripted_llm: ScriptedLLMServer) -> Settings:
    """The test settings plus a second LLM profile, `scripted`, read from a TOML file."""
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(
        f'[profiles.{PROFILE}]\nbase_url = "{scripted_llm.base_url}"\nmodel = "unset"\n'
    )
    return settings.model_copy(update={"llm_profiles_file": profiles})


@pytest.fixture
def service(page_settings: Settings, tmp_path: Path) -> Iterator[Service]:
    with running_service(page_settings, tmp_path) as svc:
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


def drop_file(page: Page, name: str, text: str) -> None:
    """Drag a file over the drop zone and drop it: real `dragenter` and `drop` events."""
    transfer = page.evaluate_handle(
        """([name, text]) => {
            const transfer = new DataTransfer();
            transfer.items.add(new File([text], name, { type: "text/plain" }));
            return transfer;
        }""",
        [name, text],
    )
    page.dispatch_event("#drop", "dragenter", {"dataTransfer": transfer})
    expect(page.locator("#drop")).to_have_class(re.compile(r"\bover\b"))
    page.dispatch_event("#drop", "drop", {"dataTransfer": transfer})
    expect(page.locator("#drop")).not_to_have_class(re.compile(r"\bover\b"))


def fill_the_form(page: Page, prompt: str, model: str, tools: str) -> None:
    page.fill("#prompt", prompt)
    page.click(".options summary")
    page.select_option("select[name=profile]", PROFILE)  # the picker, filled from /v1/llm/profiles
    page.fill("input[name=model]", model)
    page.select_option("select[name=tools]", tools)
    page.fill("input[name=max_steps]", "10")
    page.fill("input[name=command_timeout_s]", "900")


def submit(page: Page) -> str:
    page.click("#submit")
    page.wait_for_url("**#/tasks/tsk_*", timeout=WAIT_MS)
    return page.url.rsplit("/", 1)[1]


def submit_through_the_form(page: Page) -> str:
    fill_the_form(page, "Plot x² mod 7 and count to eight, slowly.", MODEL, "standard")
    drop_file(page, *DROPPED)
    page.set_input_files(
        "#file-input",
        files=[FilePayload(name=PICKED[0], mimeType="text/plain", buffer=PICKED[1].encode())],
    )
    files = page.locator("#file-list li")
    expect(files).to_have_count(2)
    expect(files.nth(0)).to_contain_text(DROPPED[0])
    expect(files.nth(0)).to_contain_text(f"{len(DROPPED[1])} B")
    expect(files.nth(1)).to_contain_text(PICKED[0])
    return submit(page)


def get_task(service: Service, task_id: str) -> dict[str, Any]:
    response = httpx.get(f"{service.base_url}/v1/tasks/{task_id}", timeout=10)
    response.raise_for_status()
    task: dict[str, Any] = response.json()
    return task


CONN_STATES = """() => {
    const conn = document.querySelector("#conn");
    window.connStates = [conn.dataset.state];
    new MutationObserver(() => {
        const states = window.connStates;
        if (states[states.length - 1] !== conn.dataset.state) states.push(conn.dataset.state);
    }).observe(conn, { attributes: true, attributeFilter: ["data-state"] });
}"""


def laptop_page(browser: Browser) -> tuple[Page, list[str]]:
    """A laptop-sized page, and the JavaScript errors it raises (a test asserts none)."""
    errors: list[str] = []
    return watched_page(browser, errors, viewport={"width": 1280, "height": 900}), errors


def test_the_page_runs_a_task_live_and_survives_an_api_restart(
    service: Service, page_settings: Settings, scripted_llm: ScriptedLLMServer, tmp_path: Path
) -> None:
    scripted_llm.add_script(MODEL, SCRIPT)
    screenshot = SCREENSHOT_DIR / "sandhive-page.png"
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page, errors = laptop_page(browser)
            page.goto(f"{service.base_url}/")
            expect(page).to_have_title("Sandhive")
            task_id = submit_through_the_form(page)

            # What the form said reached the task.
            task = get_task(service, task_id)
            assert task["llm"]["profile"] == PROFILE
            assert task["llm"]["model"] == MODEL
            assert task["tools"]["profile"] == "standard"
            assert task["limits"]["max_steps"] == 10
            assert task["limits"]["command_timeout_s"] == 900

            # The task list shows it, and follows its status.
            listed = page.locator(f"#task-list li.active a[href='#/tasks/{task_id}']")
            expect(listed).to_contain_text("Plot x² mod 7")
            expect(listed.locator(".dot")).to_have_class(
                re.compile(r"\brunning\b"), timeout=WAIT_MS
            )

            # Steps appear as they happen: the plot step completes, the counter streams.
            first = page.locator("li.step[data-index='0'][data-state='done']")
            expect(first).to_be_visible(timeout=WAIT_MS)
            running = page.locator("li.step[data-index='1'][data-state='running']")
            expect(running.locator("pre.live-output")).to_contain_text("tick 2", timeout=WAIT_MS)
            expect(running.locator("pre.shell")).to_contain_text("for i in")  # shown as it runs

            # The finished first step: reasoning collapsed until asked, the dropped and
            # picked files' contents in the observation, its exit code, timings and tokens.
            reasoning = first.locator("details.reasoning")
            expect(reasoning).to_be_visible()
            expect(reasoning).not_to_have_attribute("open", "")
            expect(reasoning.locator(".text")).to_be_hidden()
            reasoning.locator("summary").click()
            expect(reasoning.locator(".text")).to_have_text(REASONING)
            expect(first.locator("details.thought .text")).to_contain_text("I will plot")
            expect(first.locator("pre.output")).to_contain_text(DROPPED[1].strip())
            expect(first.locator("pre.output")).to_contain_text(PICKED[1].strip())
            # The package's markers shown as its console shows them (the stored text keeps `\[`).
            shown = first.locator("pre.output").inner_text()
            assert shown.startswith("Exit code: 0\nExecution output of [execute_bash]:\n[STDOUT]\n")
            expect(first.locator(".obs-head .exit")).to_have_text("exit 0")
            expect(first.locator(".step-meta")).to_have_text(STEP_META)

            expect(page.locator("#conn")).to_have_text("live")
            expect(page.locator("#t-status")).to_have_text("running")
            assert get_task(service, task_id)["status"] == "running"
            page.screenshot(path=str(screenshot), full_page=True)
            print(f"\nscreenshot of the page mid-task: {screenshot}")

            page.evaluate(CONN_STATES)
            with restarted_api(service, page_settings):
                expect(page.locator("#t-status")).to_have_text("succeeded", timeout=WAIT_MS)
                # The page noticed the restart and came back by itself.
                states: list[str] = page.evaluate("window.connStates")
                assert "reconnecting" in states, states
                assert "live" in states[states.index("reconnecting") :], states
                expect(listed.locator(".dot")).to_have_class(
                    re.compile(r"\bsucceeded\b"), timeout=WAIT_MS
                )

                steps = page.locator("li.step")
                expect(steps).to_have_count(5)
                indices = [steps.nth(i).get_attribute("data-index") for i in range(5)]
                assert indices == ["0", "1", "2", "3", "4"]
                expect(page.locator("li.step[data-state='done']")).to_have_count(5)
                ticks = page.locator("li.step[data-index='1']")
                expect(ticks.locator("pre.output")).to_contain_text("tick 8")
                expect(ticks.locator(".obs-head .exit.bad")).to_have_text("exit 3")
                expect(ticks.locator("details.reasoning")).to_be_hidden()  # it had none

                # The edit is a diff: the old text removed, the new one added.
                edit = page.locator("li.step[data-index='3']")
                expect(edit.locator(".action-line")).to_have_text("edit /testbed/output/answer.txt")
                expect(edit.locator("pre.diff .del")).to_have_text("- plot.png.")
                expect(edit.locator("pre.diff .add")).to_have_text(
                    "+ plot.png; the shape is in shape.svg."
                )
                expect(page.locator("li.step[data-index='4'] .step-meta")).to_have_text(
                    re.compile(r"^model .* · [1-9][\d,]* → [1-9][\d,]* tokens$")
                )
                expect(page.locator("#answer-text")).to_have_text(EDITED)
                check_artifacts(page, tmp_path)
                page.screenshot(
                    path=str(SCREENSHOT_DIR / "sandhive-page-finished.png"), full_page=True
                )

                # A fresh visit to the finished task (a phone, in dark mode) replays it all
                # once, and nothing on it is wider than the phone.
                phone = watched_page(
                    browser, errors, viewport=PHONE, is_mobile=True, color_scheme="dark"
                )
                phone.goto(f"{service.base_url}/")
                expect(phone.locator("#task-list a").first).to_be_visible(timeout=WAIT_MS)
                assert_no_horizontal_scroll(phone)
                phone.goto(f"{service.base_url}/#/tasks/{task_id}")
                expect(phone.locator("#t-status")).to_have_text("succeeded", timeout=WAIT_MS)
                expect(phone.locator("li.step[data-state='done']")).to_have_count(5)
                expect(phone.locator(".artifact[data-path='plot.png'] img")).to_be_visible()
                expect(phone.locator(".artifact[data-path='report.html'] iframe")).to_be_visible()
                assert_no_horizontal_scroll(phone)
                phone.screenshot(path=str(SCREENSHOT_DIR / "sandhive-page-phone.png"))

            assert errors == []
        finally:
            browser.close()

    assert task_id.startswith("tsk_")
    assert scripted_llm.failures == []


def check_artifacts(page: Page, tmp_path: Path) -> None:
    """PNG and SVG as images, HTML in a sandboxed frame, sizes, and a zip of them all."""
    artifacts = page.locator("#artifact-list li.artifact")
    expect(artifacts).to_have_count(4, timeout=WAIT_MS)

    png = page.locator(".artifact[data-path='plot.png']")
    image = png.locator("img")
    expect(image).to_be_visible(timeout=WAIT_MS)
    page.wait_for_function(
        "img => img.complete && img.naturalWidth === 600", arg=image.element_handle()
    )
    expect(png.locator(".artifact-head .hint")).to_have_text(
        re.compile(r"^\d+(\.\d)? KiB · image/png$")
    )

    svg = page.locator(".artifact[data-path='shape.svg']")
    expect(svg.locator("img")).to_be_visible(timeout=WAIT_MS)
    page.wait_for_function(
        "img => img.complete && img.naturalWidth === 160", arg=svg.locator("img").element_handle()
    )
    expect(svg.locator(".artifact-head .hint")).to_have_text(f"{len(SVG)} B · image/svg+xml")

    html = page.locator(".artifact[data-path='report.html']")
    frame = html.locator("iframe")
    expect(frame).to_be_visible(timeout=WAIT_MS)
    expect(frame).to_have_attribute("sandbox", "")  # present, and granting nothing
    expect(html.locator(".artifact-head .hint")).to_have_text(
        re.compile(rf"^{len(HTML)} B · text/html")
    )
    inside = html.frame_locator("iframe")
    expect(inside.locator("h1")).to_have_text("Sandbox report")
    expect(inside.locator("body")).not_to_have_attribute("data-ran", "yes")  # its script never ran

    answer = page.locator(".artifact[data-path='answer.txt']")
    expect(answer.locator("pre")).to_have_text(EDITED)
    expect(answer.locator(".artifact-head .hint")).to_have_text(
        re.compile(rf"^{len(EDITED)} B · text/plain")
    )

    expect(page.locator("#zip")).to_be_visible()
    with page.expect_download() as download_info:
        page.click("#zip")
    saved = tmp_path / "artifacts.zip"
    download_info.value.save_as(saved)
    with zipfile.ZipFile(io.BytesIO(saved.read_bytes())) as archive:
        assert sorted(archive.namelist()) == ["answer.txt", "plot.png", "report.html", "shape.svg"]
        assert archive.read("shape.svg").decode() == SVG


def test_the_cancel_button_cancels_a_running_task(
    service: Service, scripted_llm: ScriptedLLMServer
) -> None:
    scripted_llm.add_script(CANCEL_MODEL, CANCEL_SCRIPT)
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page, errors = laptop_page(browser)
            page.goto(f"{service.base_url}/")
            fill_the_form(page, "Wait, then be cancelled.", CANCEL_MODEL, "reference")
            task_id = submit(page)
            assert get_task(service, task_id)["tools"]["profile"] == "reference"

            step = page.locator("li.step[data-index='0'][data-state='running']")
            expect(step.locator("pre.shell")).to_contain_text("sleep 600", timeout=WAIT_MS)
            expect(page.locator("#t-status")).to_have_text("running")
            # The command is shown as soon as the model asks for it, which can be while the
            # sandbox still starts (it starts beside the first model call): cancel once it
            # has printed, so the cut step has something to keep.
            expect(step.locator("pre.live-output")).to_contain_text(
                "waiting to be cancelled", timeout=WAIT_MS
            )
            cancel = page.locator("#cancel")
            expect(cancel).to_be_enabled()
            cancel.click()

            expect(page.locator("#t-status")).to_have_text("cancelled", timeout=WAIT_MS)
            expect(cancel).to_be_hidden()
            assert get_task(service, task_id)["status"] == "cancelled"
            listed = page.locator(f"#task-list a[href='#/tasks/{task_id}'] .dot")
            expect(listed).to_have_class(re.compile(r"\bcancelled\b"), timeout=WAIT_MS)
            # The cut step is closed with what it printed, and the cancel is no error.
            card = page.locator("li.step[data-index='0']")
            expect(card).to_have_attribute("data-state", "done", timeout=WAIT_MS)
            expect(card.locator(".interrupted")).to_have_text("interrupted: cancelled")
            expect(card.locator("pre.output")).to_contain_text("waiting to be cancelled")
            expect(page.locator("#t-error")).to_have_class("note")
            page.reload()  # the replay alone closes it too: no card stays "thinking…"
            replayed = page.locator("li.step[data-index='0']")
            expect(replayed.locator(".interrupted")).to_have_text(
                "interrupted: cancelled", timeout=WAIT_MS
            )
            expect(page.locator("li.step[data-state='running']")).to_have_count(0)
            assert errors == []
        finally:
            browser.close()
    assert scripted_llm.requests[CANCEL_MODEL] == 1  # cancelled during the first command


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
        browser = launch(playwright)
        try:
            page = browser.new_page()
            page.goto(f"{keyed_service.base_url}/")
            expect(page.locator("#key-panel")).to_be_visible(timeout=WAIT_MS)  # the list got a 401
            expect(page.locator("#key-panel")).to_contain_text("sandhive keys create --tenant NAME")
            expect(page.locator("#key-input")).to_have_attribute(
                "placeholder", "the key printed by sandhive keys create"
            )
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
            expect(page.locator("#task-list > *")).to_have_count(1, timeout=WAIT_MS)
            # A key the server refuses: no "✓", and nothing the previous key listed stays.
            page.click("#key-toggle")
            page.fill("#key-input", "sk-not-a-key-of-this-server")
            page.click("#key-panel button[type=submit]")
            expect(page.locator("#key-toggle")).to_have_text("API key ✗ refused", timeout=WAIT_MS)
            expect(page.locator("#key-note")).to_have_text(
                "The server refused this API key (401): enter another."
            )
            expect(page.locator("#task-list > *")).to_have_count(0)
            expect(page.locator("#task-list-note")).to_contain_text("Could not load tasks")
        finally:
            browser.close()
