"""First use with no model at all: `sandhive serve` + `sandhive worker` as `make run` starts them.

`SANDHIVE_SCRIPTED_PROFILE=true` and no `SANDHIVE_LLM_*`: the page says no real model is
configured and offers the scripted profile, the README's first task runs from the page,
and `sandhive demo` submits through the running service so its run is in the page too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from app.config import SCRIPTED_ONLY_NOTICE, Settings
from app.scripted import DEMO_ANSWER
from app.scripted.profile import TOUR_ANSWER, TOUR_IMAGE
from tests.support.browser import WAIT_MS, launch
from tests.support.processes import Service, run_app, running_service, settings_env

README_PROMPT = "Compute the 10th Catalan number and write it to answer.txt"


@pytest.fixture
def bare(settings: Settings) -> Settings:
    """The test services, no real model, the scripted profile on (what `make run` sets)."""
    return settings.model_copy(
        update={"scripted_profile": True, "llm_base_url": "", "llm_model": ""}
    )


@pytest.fixture
def service(bare: Settings, tmp_path: Path) -> Iterator[Service]:
    with running_service(bare, tmp_path) as svc:
        yield svc


def test_the_readme_first_task_runs_from_the_page_with_no_model(service: Service) -> None:
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_page()
            page.goto(f"{service.base_url}/")
            expect(page.locator("#model-notice")).to_have_text(SCRIPTED_ONLY_NOTICE)
            expect(page.locator("select[name=profile]")).to_have_value("scripted")
            expect(page.locator("select[name=profile] option")).to_have_text(
                ["scripted (scripted demo, not a real model)"]
            )
            assert page.get_attribute("input[name=model]", "placeholder") == (
                "demo (profile default)"
            )
            page.click("#key-toggle")
            expect(page.locator("#key-panel")).to_contain_text("sandhive keys create --tenant NAME")
            placeholder = page.get_attribute("#key-input", "placeholder")
            assert placeholder == "not needed: auth is disabled on this server"
            page.fill("#prompt", README_PROMPT)
            page.click("#submit")
            expect(page.locator("#t-status")).to_have_text("succeeded", timeout=WAIT_MS)
            task_id = page.evaluate("location.hash").rsplit("/", 1)[-1]
        finally:
            browser.close()
    task = httpx.get(f"{service.base_url}/v1/tasks/{task_id}").json()
    assert (task["llm"]["profile"], task["llm"]["model"]) == ("scripted", "demo")
    assert task["answer"] == DEMO_ANSWER


def test_sandhive_demo_submits_through_the_running_service(
    service: Service, bare: Settings, tmp_path: Path
) -> None:
    done = run_app("demo", "--api-url", service.base_url, env=settings_env(bare), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"answer: {DEMO_ANSWER}" in done.stdout, done.stdout
    assert "running locally" not in done.stdout
    listed = httpx.get(f"{service.base_url}/v1/tasks").json()["items"]
    assert [(t["status"], t["llm"]["profile"]) for t in listed] == [("succeeded", "scripted")]
    assert not (tmp_path / "output").exists(), "nothing ran locally"


def test_sandhive_demo_runs_locally_without_a_service(bare: Settings, tmp_path: Path) -> None:
    done = run_app("demo", "--api-url", "http://127.0.0.1:9", env=settings_env(bare), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "running locally (no service at http://127.0.0.1:9)" in done.stdout
    assert f"answer: {DEMO_ANSWER}" in done.stdout


def test_sandhive_run_serves_the_scripted_profile_itself(bare: Settings, tmp_path: Path) -> None:
    env = {**settings_env(bare), "SANDHIVE_SCRIPTED_PROFILE": "false"}  # the flag is enough
    args = ["run", "--llm-profile", "scripted", "--model", "tour", "--prompt", "anything"]
    done = run_app(*args, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"answer: {TOUR_ANSWER}" in done.stdout, done.stdout
    (image,) = (tmp_path / "output").glob(f"*/files/{TOUR_IMAGE}")
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
