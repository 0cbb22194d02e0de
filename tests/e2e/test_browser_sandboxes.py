"""The page's Sandboxes view in a real headless Chromium, on a real API + worker.

Debian's `chromium` driven by Playwright, as in the other browser tests; API and worker
are real subprocesses with API keys on, and each sandbox is a real container. A tenant's
key is made with `sandhive keys create` (as the README says) and the page opens with it.
Sandboxes and their commands are made through the API, as their callers make them; the
page only reads.

What the page is held to: the list shows the tenant's sandboxes newest first, each with its
status (an ended one with its reason), image, CPU and memory, labels, command count and
when it expires ("in 9 min") or ended, and follows a running one without a reload (one
deleted meanwhile shows ended); a sandbox's own view shows its facts and its command log
in order (the argv shell-quoted, or the shell line; user, directory, exit code or "timed
out", duration, the key's id), a new command appears at the end without a reload (the rows
already there are kept, not redrawn), and a deletion shows it ended. A hostile command and
label (a `<script>`, an `<img onerror>`, a right-to-left override) stay text: no dialog, no
element made from them, the override shown as its code. A phone in dark mode never scrolls
sideways; no script error and no console error.
"""

from __future__ import annotations

import json
import re
import shlex
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Locator, Page, expect, sync_playwright
from pydantic import SecretStr

from app.config import Settings
from tests.support.browser import (
    PHONE,
    SCREENSHOT_DIR,
    WAIT_MS,
    assert_no_horizontal_scroll,
    launch,
    watched_page,
)
from tests.support.processes import Service, run_app, running_service, settings_env

ADMIN_KEY = "browser-sandboxes-admin-key"
HOSTILE = "<script>alert(1)</script><img src=x onerror=\"document.body.dataset.owned='yes'\">"
RLO = "\u202e"
"""A right-to-left override: text after it is drawn reversed, unless shown as its code."""
DURATION = re.compile(r"^\d+(\.\d)? (ms|s)$|^\d+ min \d+ s$")
SOON = re.compile(r"^in \d+ min$")
AGO = re.compile(r"^\d+ (s|min) ago$")


@pytest.fixture(autouse=True)
def _no_sandbox_left(no_sandbox_left: None) -> None:
    """A test's sandboxes go with it."""


@pytest.fixture
def keyed(settings: Settings) -> Settings:
    return settings.model_copy(update={"auth": "keys", "admin_api_key": SecretStr(ADMIN_KEY)})


@pytest.fixture
def service(keyed: Settings, tmp_path: Path) -> Iterator[Service]:
    """API and worker; yielded once the worker says it is ready (a sandbox needs one)."""
    with running_service(keyed, tmp_path) as svc:
        log = tmp_path / "worker.log"
        deadline = time.monotonic() + 60
        while "ready with" not in log.read_text(errors="replace"):
            assert svc.worker.poll() is None, f"the worker exited early:\n{svc.logs()}"
            assert time.monotonic() < deadline, f"the worker never got ready:\n{svc.logs()}"
            time.sleep(0.1)
        yield svc


@pytest.fixture
def api(keyed: Settings, service: Service, tmp_path: Path) -> Iterator[httpx.Client]:
    """An API client with a new tenant's key (`sandhive keys create`): its list is its own."""
    tenant = f"page-{uuid.uuid4().hex[:8]}"
    made = run_app("keys", "create", "--tenant", tenant, env=settings_env(keyed), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    with httpx.Client(
        base_url=service.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    ) as client:
        yield client
        for box in client.get("/v1/sandboxes", params={"status": "running"}).json()["items"]:
            client.delete(f"/v1/sandboxes/{box['id']}")  # a failed test leaves none running


def create(api: httpx.Client, **body: Any) -> dict[str, Any]:
    response = api.post("/v1/sandboxes", json=body)
    assert response.status_code == 201, response.text
    made: dict[str, Any] = response.json()
    return made


def run(api: httpx.Client, sandbox_id: str, **body: Any) -> dict[str, Any]:
    response = api.post(f"/v1/sandboxes/{sandbox_id}/exec", json=body)
    assert response.status_code == 200, response.text
    done: dict[str, Any] = response.json()
    return done


def delete(api: httpx.Client, sandbox_id: str) -> None:
    gone = api.delete(f"/v1/sandboxes/{sandbox_id}")
    assert gone.status_code == 200, gone.text
    assert (gone.json()["status"], gone.json()["end_reason"]) == ("ended", "deleted")


def mib_text(mib: int) -> str:
    """A size in MiB as the page writes it (app.js formatBytes): `512 MiB`, `2.0 GiB`."""
    if mib < 1024:
        return f"{mib} MiB"
    gib = mib / 1024
    return f"{gib:.1f} GiB" if gib < 10 else f"{round(gib)} GiB"


def key_of(page: Page, key: str) -> None:
    """Every load of `page` starts with `key` saved, as after pasting it under API key."""
    page.add_init_script(f"localStorage.setItem('sandhive.apiKey', {json.dumps(key)})")


def shot(page: Page, name: str) -> None:
    path = SCREENSHOT_DIR / f"sandhive-sandboxes-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def listed(page: Page, sandbox_id: str) -> Locator:
    return page.locator(f"#sandboxes .sbx-table tr[data-id='{sandbox_id}']")


def field(row: Locator, name: str) -> Locator:
    return row.locator(f"[data-field={name}]")


def assert_nothing_ran(page: Page) -> None:
    """The hostile texts made no element and ran nothing (a dialog is caught as a problem)."""
    assert page.locator("#sandboxes script, #sandboxes img").count() == 0
    assert page.evaluate("document.body.dataset.owned") is None


def test_the_page_lists_sandboxes_and_follows_a_command_log(
    service: Service, api: httpx.Client
) -> None:
    base = service.base_url
    key = str(api.headers["Authorization"]).removeprefix("Bearer ")
    older = create(api, ttl_s=600, metadata={"run": "page", "which": "older"})
    box = create(api, ttl_s=600, metadata={"run": "page", "note": HOSTILE})
    sid = box["id"]
    printed = run(api, sid, argv=["printf", "%s\n", HOSTILE])
    assert (printed["exit_code"], printed["stdout"]) == (0, f"{HOSTILE}\n")
    failed = run(api, sid, command=f"echo abc{RLO}def; exit 3", user="nobody", cwd="/tmp")
    assert (failed["exit_code"], failed["stdout"]) == (3, f"abc{RLO}def\n")
    log = api.get(f"/v1/sandboxes/{sid}/commands").json()["items"]
    assert [entry["seq"] for entry in log] == [1, 2]
    key_id = log[0]["key_id"]
    assert str(key_id).startswith("key_"), log

    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = watched_page(
                browser,
                problems,
                console_errors=True,
                dialogs=True,
                viewport={"width": 1280, "height": 900},
            )
            key_of(page, key)
            page.goto(f"{base}/")
            page.click("nav a[data-nav=sandboxes]")
            expect(page).to_have_url(f"{base}/#/sandboxes")
            expect(page.locator("nav a[data-nav=sandboxes]")).to_have_attribute(
                "aria-current", "page"
            )
            expect(page.locator("nav a[data-nav=tasks]")).not_to_have_attribute(
                "aria-current", "page"
            )
            expect(page.locator("#tasks-main")).to_be_hidden()

            # The list: newest first, every column.
            rows = page.locator("#sandboxes .sbx-table tbody tr")
            expect(rows).to_have_count(2, timeout=WAIT_MS)
            expect(rows.nth(0)).to_have_attribute("data-id", sid)
            expect(rows.nth(1)).to_have_attribute("data-id", older["id"])
            row = listed(page, sid)
            expect(field(row, "id")).to_have_text(sid)
            expect(field(row, "status")).to_have_text("running")
            expect(field(row, "image")).to_have_text(box["image"])
            resources = f"{box['cpus']:g} CPU · {mib_text(box['memory_mb'])}"
            expect(field(row, "resources")).to_have_text(resources)
            labels = field(row, "metadata").locator(".sbx-label")
            expect(labels).to_have_count(2)
            assert sorted(labels.all_text_contents()) == [f"note={HOSTILE}", "run=page"]  # text
            expect(field(row, "commands")).to_have_text("2")
            expect(field(row, "when")).to_have_text(SOON)
            expect(field(listed(page, older["id"]), "commands")).to_have_text("0")
            assert_nothing_ran(page)
            shot(page, "list")

            # It follows a running sandbox without a reload: one deleted meanwhile ends.
            page.evaluate("window.sameDocument = true")
            delete(api, older["id"])
            older_row = listed(page, older["id"])
            expect(field(older_row, "status")).to_have_text("ended · deleted", timeout=WAIT_MS)
            expect(field(older_row, "when")).to_have_text(AGO)
            assert page.evaluate("window.sameDocument") is True

            # One sandbox: its facts, its log in order.
            field(row, "id").locator("a").click()
            expect(page).to_have_url(f"{base}/#/sandboxes/{sid}")
            expect(page.locator("#sbx-status")).to_have_text("running")
            expect(page.locator("#sbx-id")).to_have_text(sid)
            facts = page.locator("#sbx-facts")
            expect(field(facts, "image").locator("dd")).to_have_text(box["image"])
            expect(field(facts, "workdir").locator("dd")).to_have_text("/testbed")
            expect(field(facts, "commands").locator("dd")).to_have_text("2")
            expect(page.locator(".sbx-head")).not_to_contain_text("null")
            expect(page.locator("#sbx-why")).to_have_count(0)  # no `error`: none shown
            expect(field(facts, "expires").locator("dd")).to_contain_text(re.compile(r"in \d+ min"))
            commands = page.locator(".sbx-commands tbody tr")
            expect(commands).to_have_count(2)
            expect(page.locator("#sbx-log-title")).to_have_text("Commands (2)")
            first, second = commands.nth(0), commands.nth(1)
            expect(first).to_have_attribute("data-seq", "1")
            expect(second).to_have_attribute("data-seq", "2")
            quoted = shlex.join(["printf", "%s\n", HOSTILE])
            assert quoted.startswith("printf '%s\n' '<script>"), quoted
            expect(field(first, "command").locator("code")).to_have_text(quoted)
            expect(field(first, "command").locator("code")).to_have_attribute("data-kind", "argv")
            expect(field(first, "exit")).to_have_text("0")
            expect(field(first, "user")).to_have_text("root")
            expect(field(first, "cwd")).to_have_text("/testbed")
            expect(field(first, "key")).to_have_text(key_id)
            expect(field(first, "duration")).to_have_text(DURATION)
            command = field(second, "command").locator("code")
            expect(command).to_have_text("echo abc[U+202E]def; exit 3")  # no reversed text
            expect(command).to_have_attribute("data-kind", "shell")
            expect(field(second, "exit")).to_have_text("3")
            expect(field(second, "exit").locator(".exit")).to_have_class("exit bad")
            expect(field(second, "user")).to_have_text("nobody")
            expect(field(second, "cwd")).to_have_text("/tmp")
            assert_nothing_ran(page)
            expect(page.locator("#conn")).to_have_text("updating every 2 s")
            shot(page, "one")

            # A new command appears at the end; the rows there are kept, not redrawn.
            page.evaluate("document.querySelector('.sbx-commands tbody tr').dataset.kept = 'yes'")
            # It shows as it is sent (running), and gets its outcome when it ends.
            with ThreadPoolExecutor(1) as pool:
                pending = pool.submit(run, api, sid, command="sleep 30", timeout_s=6)
                expect(commands).to_have_count(3, timeout=WAIT_MS)
                third = commands.nth(2)
                expect(field(third, "exit")).to_contain_text("running")
                late = pending.result()
            assert (late["timed_out"], late["exit_code"]) == (True, None)
            expect(third).to_have_attribute("data-seq", "3")
            expect(field(third, "command").locator("code")).to_have_text("sleep 30")
            expect(field(third, "exit")).to_have_text("timed out", timeout=WAIT_MS)
            expect(first).to_have_attribute("data-kept", "yes")
            expect(field(facts, "commands").locator("dd")).to_have_text("3")
            assert page.evaluate("window.sameDocument") is True

            # Deleted: it shows ended, and the page stops following it.
            delete(api, sid)
            expect(page.locator("#sbx-status")).to_have_text("ended · deleted", timeout=WAIT_MS)
            expect(page.locator("#conn")).to_have_text("ended")
            expect(field(facts, "ended").locator("dd")).to_contain_text("ago")
            expect(commands).to_have_count(3)
            shot(page, "ended")

            # Back to the list: both ended, the count and when.
            page.click("a.exp-back")
            expect(page).to_have_url(f"{base}/#/sandboxes")
            row = listed(page, sid)
            expect(field(row, "status")).to_have_text("ended · deleted", timeout=WAIT_MS)
            expect(field(row, "commands")).to_have_text("3")
            expect(field(row, "when")).to_have_text(AGO)
            assert page.evaluate("window.sameDocument") is True

            # A phone in dark mode: the list and the log scroll inside their cards.
            phone = watched_page(
                browser,
                problems,
                console_errors=True,
                dialogs=True,
                viewport=PHONE,
                is_mobile=True,
                color_scheme="dark",
            )
            key_of(phone, key)
            phone.goto(f"{base}/#/sandboxes")
            expect(phone.locator("#sandboxes .sbx-table tbody tr")).to_have_count(2)
            assert_no_horizontal_scroll(phone)
            shot(phone, "list-phone")
            phone.goto(f"{base}/#/sandboxes/{sid}")
            expect(phone.locator(".sbx-commands tbody tr")).to_have_count(3)
            assert_no_horizontal_scroll(phone)
            shot(phone, "one-phone")
            assert_nothing_ran(phone)
        finally:
            browser.close()
    assert problems == []


def test_an_unknown_sandbox_is_not_found_and_an_empty_list_says_so(
    service: Service, api: httpx.Client
) -> None:
    key = str(api.headers["Authorization"]).removeprefix("Bearer ")
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = watched_page(browser, problems)  # the 404 itself is logged to the console
            key_of(page, key)
            page.goto(f"{service.base_url}/#/sandboxes")
            expect(page.locator("#sbx-list-note")).to_contain_text("No sandboxes yet")
            page.goto(f"{service.base_url}/#/sandboxes/sbx_00000000000000000000000000")
            expect(page.locator("#sbx-error")).to_contain_text(
                "There is no such sandbox (or it is not yours)."
            )
            expect(page.locator("#conn")).to_have_text("not found")
        finally:
            browser.close()
    assert problems == []
