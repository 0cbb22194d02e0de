"""What the page's browser tests (tests/e2e/test_browser_*.py) share: one way to start
Chromium, pages whose errors are kept for the test to assert on, and the sizes and waits.

Debian's `chromium` driven by Playwright (`executable_path`, never `playwright install`),
so the tests need no download; it lives here, not in a test module, so that no test module
imports another.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, Page, Playwright, ViewportSize

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
"""Where screenshots go: outside the repository, for anyone to look at the page."""
WAIT_MS = 90_000
PHONE: ViewportSize = {"width": 390, "height": 844}


def launch(playwright: Playwright) -> Browser:
    """Debian's Chromium, headless and kept from calling home, so every test runs the same one."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def watched_page(
    browser: Browser,
    errors: list[str],
    *,
    console_errors: bool = False,
    dialogs: bool = False,
    **new_page_options: Any,
) -> Page:
    """A new page (`browser.new_page(**new_page_options)`) whose script errors are appended to
    `errors` as they happen, so a test can assert that the page raised none.

    Alone, a script error is kept as its message. With `console_errors` (a refused request or
    a Content-Security-Policy violation is only logged to the console) and `dialogs` (an
    `alert` a hostile text might open), each is kept labelled by its kind: `pageerror: …`,
    `console: …`, `dialog: …`. Handlers are added before the page loads anything, so
    nothing it raises is missed.
    """
    page = browser.new_page(**new_page_options)
    if console_errors or dialogs:
        page.on("pageerror", lambda error: errors.append(f"pageerror: {error}"))
    else:
        page.on("pageerror", lambda error: errors.append(str(error)))
    if console_errors:
        page.on(
            "console",
            lambda message: (
                errors.append(f"console: {message.text}") if message.type == "error" else None
            ),
        )
    if dialogs:
        page.on("dialog", lambda dialog: errors.append(f"dialog: {dialog.message}"))
    return page


def assert_no_horizontal_scroll(page: Page) -> None:
    """Nothing on a `PHONE`-sized page is wider than the phone: it never scrolls sideways."""
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the page is {width}px wide on a {PHONE['width']}px phone"
