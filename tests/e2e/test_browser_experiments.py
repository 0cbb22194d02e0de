"""The page's Experiments view in a real headless Chromium: create from a file, watch, read.

Debian's `chromium` driven by Playwright, as in `test_browser_page.py`; API and worker are
real subprocesses, each sandbox item runs in a real container and the scripted LLM plays
both arms: the sandbox arm's model copies the row's input file `a.txt` to its answer, the
vanilla arm's model answers "42" to everything. So every score is chosen here, and the
means, the paired difference and its wins/ties/losses below are computed by hand.

What the page is held to: the form uploads a JSONL dataset file (multipart, through
`POST /v1/experiments`) with two arms and a scorer; the progress bars move while it runs
(without a reload) and end full; the results table shows the API's numbers; the plots are
drawn with their data (bars with their intervals, histograms, a scatter) on canvases; a
hostile row id and answer stay text; a row's arms show side by side; an item opens its
task's trajectory in the task view; the list shows the experiment; a phone in dark mode
never scrolls sideways; no script error and no Content-Security-Policy violation.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import FilePayload, Page, expect, sync_playwright

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
from tests.support.processes import Service, running_service

HOSTILE = "<img src=x onerror=\"document.body.dataset.owned='yes'\">"
# row id, ground truth, the sandbox arm's answer, domain; the vanilla arm always says "42"
ROWS = [
    ("q1", "42", "42", "arith"),
    ("q2", "7", "7", "arith"),
    ("q3", "13", "12", "arith"),
    ("q4", "42", "42", "trivia"),
    (f"q5 {HOSTILE}", HOSTILE, HOSTILE, "trivia"),
]
# exact: sandbox right on q1 q2 q4 q5 (0.8), vanilla on q1 q4 (0.4); sandbox - vanilla wins
# q2 and q5, ties q1 q3 q4, loses none.
SANDBOX_MEAN, VANILLA_MEAN = 0.8, 0.4
PLOTS = ["score", "domains", "tokens", "steps", "score-steps"]
# The sandbox arm's colour in the plots (experiments.js PALETTE.light[0], #b7791f).
SANDBOX_RGB = (183, 121, 31)


def dataset_file() -> bytes:
    lines = [
        json.dumps(
            {
                "id": row_id,
                "problem_statement": f"Answer {row_id}.",
                "ground_truth": truth,
                "input_files": {"a.txt": answer},
                "domain": domain,
            }
        )
        for row_id, truth, answer, domain in ROWS
    ]
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def service(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    fast = settings.model_copy(update={"experiment_tick_s": 0.2, "worker_concurrency": 3})
    with running_service(fast, tmp_path) as svc:
        yield svc


def models(scripted_llm: ScriptedLLMServer) -> tuple[str, str]:
    sandbox = f"exp-page-copy-{uuid.uuid4().hex[:8]}"
    copy = "cp /testbed/input/a.txt /testbed/output/answer.txt && sleep 1"
    scripted_llm.add_script(
        sandbox,
        Script(turns=[Turn("execute_bash", {"command": copy}, content="Copying."), Turn("submit")]),
    )
    vanilla = f"exp-page-vanilla-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(vanilla, Script(turns=[Turn(content="42")], tools="none"))
    return sandbox, vanilla


def get(service: Service, path: str) -> Any:
    response = httpx.get(f"{service.base_url}{path}", timeout=30)
    response.raise_for_status()
    return response.json()


def fill_the_form(page: Page, sandbox_model: str, vanilla_model: str) -> None:
    page.fill("#exp-name", "page: sandbox vs vanilla")
    page.set_input_files(
        "#exp-dataset",
        files=[FilePayload(name="rows.jsonl", mimeType="application/jsonl", buffer=dataset_file())],
    )
    expect(page.locator("#exp-file-note")).to_contain_text("rows.jsonl")
    expect(page.locator("#exp-file-note")).to_contain_text("5 rows · domains: arith, trivia")
    arms = page.locator("fieldset.exp-arm")
    expect(arms).to_have_count(2)
    # The profile picker is filled from /v1/llm/profiles.
    expect(arms.nth(0).locator("select[name=profile] option[value=default]")).to_have_count(1)
    arms.nth(0).locator("input[name=arm_name]").fill("sandbox")
    arms.nth(0).locator("select[name=mode]").select_option("sandbox")
    arms.nth(0).locator("input[name=model]").fill(sandbox_model)
    arms.nth(0).locator("input[name=max_steps]").fill("6")
    arms.nth(1).locator("input[name=arm_name]").fill("vanilla")
    arms.nth(1).locator("select[name=mode]").select_option("vanilla")
    expect(arms.nth(1).locator("input[name=max_steps]")).to_be_disabled()
    arms.nth(1).locator("input[name=model]").fill(vanilla_model)
    page.select_option("#exp-scorer-kind", "exact")
    page.fill("#exp-scorer-options", '{"case_sensitive": true}')
    page.fill("#exp-attempts", "1")
    page.fill("#exp-concurrency", "3")


# Records every distinct `data-done` of each arm's progress bar, from the first render on.
SEGMENT_LOOKS = """() => {
    const bar = document.querySelector(".exp-bar");
    const looks = {};
    for (const status of ["running", "scoring", "scored", "error"]) {
        const seg = document.createElement("span");
        seg.className = `seg ${status}`;
        bar.append(seg);
        looks[status] = getComputedStyle(seg).backgroundImage;
        seg.remove();
    }
    return looks;
}"""
"""How a bar draws a segment of each status (a plain colour has no background image)."""

PROGRESS_SEEN = """() => {
    window.progressSeen = {};
    const note = () => {
        for (const node of document.querySelectorAll(".exp-arm-progress")) {
            const seen = (window.progressSeen[node.dataset.arm] ||= []);
            if (seen[seen.length - 1] !== node.dataset.done) seen.push(node.dataset.done);
        }
    };
    note();
    new MutationObserver(note).observe(document.querySelector("#experiments"),
        { subtree: true, childList: true, attributes: true });
    const conn = document.querySelector("#conn");
    window.connStates = [conn.dataset.state];
    new MutationObserver(() => {
        const states = window.connStates;
        if (states[states.length - 1] !== conn.dataset.state) states.push(conn.dataset.state);
    }).observe(conn, { attributes: true, attributeFilter: ["data-state"] });
}"""

CHART_DATA = """canvas => {
    const chart = Chart.getChart(canvas);
    return {
        type: chart.config.type,
        labels: chart.data.labels,
        datasets: chart.data.datasets.map(d => ({ label: d.label, data: d.data,
                                                  errorBars: d.errorBars || null })),
    };
}"""

# How many of the canvas's pixels are drawn, and whether one has the colour asked for.
PIXELS = """([canvas, rgb]) => {
    const { data } = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
    let drawn = 0, colour = 0;
    for (let i = 0; i < data.length; i += 4) {
        if (data[i + 3] > 0) drawn += 1;
        if (Math.abs(data[i] - rgb[0]) < 4 && Math.abs(data[i + 1] - rgb[1]) < 4
            && Math.abs(data[i + 2] - rgb[2]) < 4 && data[i + 3] > 200) colour += 1;
    }
    return { drawn, colour };
}"""


def interval(ci: dict[str, float] | None) -> str:
    return (
        "—" if ci is None else f"{ci['low']:.3f} \u2013 {ci['high']:.3f}"
    )  # an en dash, as the page writes


def check_results_table(page: Page, results: dict[str, Any]) -> None:
    """Every number of the table is the API's, formatted; and the API's are the hand-made ones."""
    sandbox, vanilla = results["arms"]
    assert (sandbox["arm"], sandbox["n"], sandbox["mean"]) == ("sandbox", 5, SANDBOX_MEAN)
    assert (vanilla["arm"], vanilla["n"], vanilla["mean"]) == ("vanilla", 5, VANILLA_MEAN)
    for arm in results["arms"]:
        row = page.locator(f".exp-arms-table tr[data-arm='{arm['arm']}']")
        expect(row.locator("[data-field=n]")).to_have_text(str(arm["n"]))
        expect(row.locator("[data-field=coverage]")).to_have_text("5/5 scored")
        expect(row.locator("[data-field=mean]")).to_have_text(f"{arm['mean']:.3f}")
        expect(row.locator("[data-field=ci95]")).to_have_text(interval(arm["ci95"]))
        expect(row.locator("[data-field=pass_at_k]")).to_have_text("—")  # one attempt
        expect(row.locator("[data-field=errors]")).to_have_text("0")
        expect(row.locator("[data-field=steps]")).to_have_text(f"{arm['steps']['median']:g}")
        assert (
            json.loads(row.locator("[data-field=ci95]").get_attribute("data-value") or "")
            == (arm["ci95"])
        )
    expect(page.locator(".exp-arms-table tr[data-arm='sandbox'] [data-field=mode]")).to_have_text(
        "sandbox"
    )
    (pair,) = results["pairs"]
    assert (pair["a"], pair["b"], pair["n"]) == ("sandbox", "vanilla", 5)
    assert pair["difference"] == pytest.approx(0.4)
    assert (pair["wins"], pair["ties"], pair["losses"]) == (2, 3, 0)
    row = page.locator(".exp-pairs-table tr[data-pair='sandbox|vanilla']")
    expect(row.locator("[data-field=difference]")).to_have_text(f"{pair['difference']:.3f}")
    assert pair["ci95_method"] == "hoeffding", "5 rows: too few for a bootstrap"
    expect(row.locator("[data-field=ci95]")).to_have_text(f"{interval(pair['ci95'])} hoeffding")
    expect(row.locator("[data-field=wlt]")).to_have_text("2 / 3 / 0")
    assert pair["p_value"] == pytest.approx(0.5), "2 wins, 0 losses: the sign test's 2 / 2^2"
    expect(row.locator("[data-field=p_value]")).to_have_text("0.500")
    expect(row.locator("[data-field=verdict]")).to_have_text("too few pairs")
    summary = "too few rows with a winner (2; 8 needed) to tell sandbox and vanilla apart"
    assert pair["summary"] == summary
    expect(page.locator(".exp-pair-summaries li[data-pair='sandbox|vanilla']")).to_have_text(
        summary
    )
    expect(row.locator("[data-field=mean_a]")).to_have_text("0.800")
    expect(row.locator("[data-field=mean_b]")).to_have_text("0.400")


def check_plots(page: Page, results: dict[str, Any], items: list[dict[str, Any]]) -> None:
    """Each plot is a Chart.js chart holding the experiment's data, and it is drawn."""
    for key in PLOTS:
        canvas = page.locator(f"figure.exp-plot[data-plot='{key}'] canvas")
        expect(canvas).to_be_visible()
        pixels = page.evaluate(PIXELS, [canvas.element_handle(), list(SANDBOX_RGB)])
        assert pixels["colour"] > 20, f"the {key} plot drew nothing in the sandbox arm's colour"
        assert pixels["drawn"] > 2000, f"the {key} plot is nearly blank: {pixels}"
    sandbox, vanilla = results["arms"]

    score = page.evaluate(CHART_DATA, page.locator("canvas[data-plot=score]").element_handle())
    assert score["labels"] == ["sandbox", "vanilla"]
    (bars,) = score["datasets"]
    assert bars["data"] == [SANDBOX_MEAN, VANILLA_MEAN]
    assert bars["errorBars"] == [sandbox["ci95"], vanilla["ci95"]]

    domains = page.evaluate(CHART_DATA, page.locator("canvas[data-plot=domains]").element_handle())
    assert domains["labels"] == ["arith", "trivia"]
    by_arm = {d["label"]: d for d in domains["datasets"]}
    assert by_arm["sandbox"]["data"] == [pytest.approx(2 / 3), 1.0]
    assert by_arm["vanilla"]["data"] == [pytest.approx(1 / 3), 0.5]
    assert by_arm["vanilla"]["errorBars"][1] == vanilla["domains"]["trivia"]["ci95"]

    for key in ("tokens", "steps"):
        chart = page.evaluate(CHART_DATA, page.locator(f"canvas[data-plot={key}]").element_handle())
        counts = {d["label"]: sum(d["data"]) for d in chart["datasets"]}
        assert counts == {"sandbox": 5, "vanilla": 5}, (key, chart)
    steps = page.evaluate(CHART_DATA, page.locator("canvas[data-plot=steps]").element_handle())
    # A vanilla item is one model call (1 step); each sandbox item took 2 (copy, submit).
    assert steps["labels"] == ["1", "2"]
    assert {d["label"]: d["data"] for d in steps["datasets"]} == {
        "sandbox": [0, 5],
        "vanilla": [5, 0],
    }

    scatter = page.evaluate(
        CHART_DATA, page.locator("canvas[data-plot='score-steps']").element_handle()
    )
    points = {d["label"]: d["data"] for d in scatter["datasets"]}
    expected = {
        arm: sorted((i["steps"], i["score"]) for i in items if i["arm"] == arm)
        for arm in ("sandbox", "vanilla")
    }
    assert {arm: sorted((p["x"], p["y"]) for p in got) for arm, got in points.items()} == expected


def check_items(page: Page, items: list[dict[str, Any]]) -> None:
    rows = page.locator(".exp-items-table tbody tr")
    expect(rows).to_have_count(10)
    expect(page.locator("#exp-items-title")).to_have_text("Items (10)")
    hostile = page.locator(".exp-items-table tbody tr[data-arm='sandbox']").filter(
        has_text="q5 <img"
    )
    expect(hostile.locator("a.row-link")).to_have_text(f"q5 {HOSTILE}")  # as text
    expect(hostile.locator("[data-field=answer]")).to_have_text(HOSTILE)
    expect(hostile.locator("[data-field=score]")).to_have_text("1.000")
    assert page.locator("#experiments img").count() == 0
    assert page.evaluate("document.body.dataset.owned") is None
    for item in items:
        row = page.locator(
            f".exp-items-table tr[data-arm='{item['arm']}'][data-attempt='{item['attempt']}']"
        ).filter(
            has=page.locator("a.row-link", has_text=re.compile(f"^{re.escape(item['row_id'])}$"))
        )
        expect(row.locator("[data-field=score]")).to_have_text(f"{item['score']:.3f}")
        expect(row.locator("a.task-link")).to_have_attribute("href", f"#/tasks/{item['task_id']}")
    # Filtering by arm leaves that arm's items.
    page.select_option(".exp-items select[name=arm]", "vanilla")
    expect(rows).to_have_count(5)
    page.select_option(".exp-items select[name=arm]", "")
    expect(rows).to_have_count(10)


def check_row_view(page: Page, items: list[dict[str, Any]], experiment_id: str) -> str:
    """q2 side by side: the sandbox arm right, the vanilla arm wrong; returns its sandbox task."""
    page.locator(".exp-items-table a.row-link", has_text=re.compile("^q2$")).first.click()
    page.wait_for_url(f"**#/experiments/{experiment_id}/rows/q2", timeout=WAIT_MS)
    arms = page.locator(".exp-row-arm")
    expect(arms).to_have_count(2)
    sandbox, vanilla = arms.nth(0), arms.nth(1)
    expect(sandbox).to_have_attribute("data-arm", "sandbox")
    expect(sandbox.locator(".answer-text")).to_have_text("7")
    expect(sandbox.locator("[data-field=score]")).to_have_text("score 1.000")
    expect(vanilla.locator(".answer-text")).to_have_text("42")
    expect(vanilla.locator("[data-field=score]")).to_have_text("score 0.000")
    expect(page.locator(".exp-problem")).to_have_text("Answer q2.", timeout=WAIT_MS)
    # Both arms sit side by side on a laptop.
    left, right = sandbox.bounding_box(), vanilla.bounding_box()
    assert left is not None
    assert right is not None
    assert abs(left["y"] - right["y"]) < 2
    assert right["x"] > left["x"] + left["width"] - 1
    page.screenshot(path=str(SCREENSHOT_DIR / "sandhive-experiment-row.png"), full_page=True)
    (task_id,) = [i["task_id"] for i in items if i["row_id"] == "q2" and i["arm"] == "sandbox"]
    return str(task_id)


def test_the_page_runs_an_experiment_from_a_dataset_file(
    service: Service, scripted_llm: ScriptedLLMServer
) -> None:
    sandbox_model, vanilla_model = models(scripted_llm)
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
            page.goto(f"{service.base_url}/")
            page.click("nav a[data-nav=experiments]")
            expect(page.locator("nav a[data-nav=experiments]")).to_have_attribute(
                "aria-current", "page"
            )
            expect(page.locator("#experiments")).to_contain_text("No experiments yet.")
            page.click("text=New experiment")
            fill_the_form(page, sandbox_model, vanilla_model)
            page.screenshot(
                path=str(SCREENSHOT_DIR / "sandhive-experiment-new.png"), full_page=True
            )
            page.click("#exp-submit")
            page.wait_for_url("**#/experiments/exp_*", timeout=WAIT_MS)
            experiment_id = page.url.rsplit("/", 1)[1]
            page.evaluate(PROGRESS_SEEN)

            # What the form said reached the experiment.
            created = get(service, f"/v1/experiments/{experiment_id}")
            assert created["name"] == "page: sandbox vs vanilla"
            assert created["rows"] == 5
            assert created["arms"] == [
                {"name": "sandbox", "mode": "sandbox", "profile": "default"},
                {"name": "vanilla", "mode": "vanilla", "profile": "default"},
            ]
            expect(page.locator("#exp-scripted")).to_have_count(0)  # a model's numbers
            assert created["scorer"] == {"kind": "exact", "case_sensitive": True}
            assert (created["attempts"], created["concurrency"]) == (1, 3)

            # It runs live: progress bars per arm, taken mid-run, then full.
            expect(page.locator(".exp-arm-progress")).to_have_count(2)
            expect(page.locator("#exp-status")).to_have_text("running")
            expect(page.locator("#conn")).to_have_text("live", timeout=WAIT_MS)
            page.screenshot(path=str(SCREENSHOT_DIR / "sandhive-experiment-running.png"))
            expect(page.locator("#exp-status")).to_have_text("finished", timeout=WAIT_MS)
            for arm in ("sandbox", "vanilla"):
                bar = page.locator(f".exp-arm-progress[data-arm='{arm}']")
                expect(bar).to_have_attribute("data-done", "5")
                expect(bar.locator("[role=progressbar]")).to_have_attribute("aria-valuenow", "5")
                expect(bar.locator(".counts")).to_contain_text("5 scored")
            drawn = page.evaluate(SEGMENT_LOOKS)  # under way is hatched; ended items are solid
            assert drawn["running"].startswith("repeating-linear-gradient"), drawn
            assert drawn["scoring"].startswith("repeating-linear-gradient"), drawn
            assert (drawn["scored"], drawn["error"]) == ("none", "none"), drawn
            seen: dict[str, list[str]] = page.evaluate("window.progressSeen")
            assert len(seen["sandbox"]) >= 3, seen  # it moved while we watched, no reload
            assert seen["sandbox"][-1] == "5"
            assert "live" in page.evaluate("window.connStates")  # followed the event stream
            expect(page.locator("#conn")).to_have_text("finished")
            expect(page.locator("article.exp")).to_have_attribute(
                "data-loaded", "final", timeout=WAIT_MS
            )

            results = get(service, f"/v1/experiments/{experiment_id}/results")
            items = get(service, f"/v1/experiments/{experiment_id}/items")["items"]
            check_results_table(page, results)
            check_plots(page, results, items)
            check_items(page, items)
            page.screenshot(path=str(SCREENSHOT_DIR / "sandhive-experiment.png"), full_page=True)
            print(
                f"\nscreenshots of the Experiments view: {SCREENSHOT_DIR}/sandhive-experiment*.png"
            )

            # One row side by side, then one item's trajectory in the task view.
            task_id = check_row_view(page, items, experiment_id)
            page.locator(".exp-row-arm[data-arm='sandbox'] a.task-link").click()
            page.wait_for_url(f"**#/tasks/{task_id}", timeout=WAIT_MS)
            expect(page.locator("#task")).to_be_visible()
            expect(page.locator("#experiments")).to_be_hidden()
            expect(page.locator("#t-status")).to_have_text("succeeded", timeout=WAIT_MS)
            expect(page.locator("li.step[data-state='done']")).to_have_count(2, timeout=WAIT_MS)
            expect(page.locator("li.step[data-index='0'] pre.shell")).to_contain_text("cp /testbed")
            expect(page.locator("#answer-text")).to_have_text("7")
            page.go_back()
            expect(page.locator(".exp-row-arm")).to_have_count(2, timeout=WAIT_MS)

            # The hostile row, through the "next row" links: its id and answer stay text.
            page.click("text=next row →")
            page.click("text=next row →")
            page.click("text=next row →")
            expect(page.locator("article.exp-row h1 code")).to_have_text(f"q5 {HOSTILE}")
            expect(page.locator(".exp-row-arm[data-arm='sandbox'] .answer-text")).to_have_text(
                HOSTILE, timeout=WAIT_MS
            )
            assert page.locator("#experiments img").count() == 0
            assert page.evaluate("document.body.dataset.owned") is None

            # The list shows it, finished.
            page.click("nav a[data-nav=experiments]")
            listed = page.locator(f".exp-list tr[data-id='{experiment_id}']")
            expect(listed.locator(".badge")).to_have_text("finished", timeout=WAIT_MS)
            expect(listed.locator("[data-field=done]")).to_have_text("10 / 10")
            expect(listed.locator("[data-field=arms]")).to_have_text(
                "sandbox (sandbox), vanilla (vanilla)"
            )

            # A phone in dark mode: the finished experiment, nothing wider than the phone.
            phone = watched_page(
                browser,
                problems,
                console_errors=True,
                dialogs=True,
                viewport=PHONE,
                is_mobile=True,
                color_scheme="dark",
            )
            phone.goto(f"{service.base_url}/#/experiments/{experiment_id}")
            expect(phone.locator("article.exp")).to_have_attribute(
                "data-loaded", "final", timeout=WAIT_MS
            )
            expect(phone.locator("figure.exp-plot canvas")).to_have_count(len(PLOTS))
            assert_no_horizontal_scroll(phone)
            phone.screenshot(
                path=str(SCREENSHOT_DIR / "sandhive-experiment-phone.png"), full_page=True
            )
            phone.goto(f"{service.base_url}/#/experiments/new")
            expect(phone.locator("fieldset.exp-arm")).to_have_count(2)
            assert_no_horizontal_scroll(phone)
        finally:
            browser.close()

    assert problems == []
    assert scripted_llm.failures == []


def test_the_form_shows_every_problem_and_starts_nothing(service: Service) -> None:
    problems: list[str] = []
    bad = b'{"id": "r1", "problem_statement": "p", "ground_truth": "1"}\n{"id": "r1"}\n'
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = watched_page(browser, problems, console_errors=True, dialogs=True)
            page.goto(f"{service.base_url}/#/experiments/new")
            page.fill("#exp-name", "bad rows")
            page.click("#exp-submit")
            expect(page.locator(".exp-form-error")).to_have_text(
                "Choose a dataset file (.jsonl or .json)."
            )
            page.set_input_files(
                "#exp-dataset",
                files=[FilePayload(name="bad.jsonl", mimeType="application/jsonl", buffer=bad)],
            )
            page.fill("#exp-scorer-options", "{not json")
            page.click("#exp-submit")
            expect(page.locator(".exp-form-error")).to_contain_text(
                "The scorer options are not JSON"
            )
            page.fill("#exp-scorer-options", "")
            page.click("#exp-submit")
            # The server's 422 lists each problem with its location; the page shows them all.
            error = page.locator(".exp-form-error .error")
            expect(error).to_contain_text("Not started:", timeout=WAIT_MS)
            expect(error.locator(".details li").first).to_be_visible()
            details = error.locator(".details").inner_text()
            assert "dataset.rows.1" in details, details
            assert page.url.endswith("#/experiments/new")
        finally:
            browser.close()
    assert get(service, "/v1/experiments")["experiments"] == []
    # The refused submission is the only console error (the browser logs the failed request).
    assert all("422" in p for p in problems), problems


@pytest.fixture
def capped_service(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    """A service that lets a tenant hold one event stream at a time."""
    capped = settings.model_copy(update={"experiment_tick_s": 0.2, "stream_max_per_tenant": 1})
    with running_service(capped, tmp_path) as svc:
        yield svc


def test_without_its_stream_the_page_polls_and_its_cancel_button_cancels(
    capped_service: Service, scripted_llm: ScriptedLLMServer
) -> None:
    service = capped_service
    slow = f"exp-page-slow-{uuid.uuid4().hex[:8]}"
    scripted_llm.add_script(
        slow,
        Script(turns=[Turn("execute_bash", {"command": "sleep 600"}), Turn("submit")]),
    )
    rows = [{"id": f"r{i}", "problem_statement": "wait", "ground_truth": "1"} for i in range(4)]
    created = httpx.post(
        f"{service.base_url}/v1/experiments",
        json={
            "name": "to be cancelled",
            "dataset": {"rows": rows},
            "arms": [{"name": "slow", "task": {"llm": {"model": slow}}}],
            "scorer": {"kind": "exact"},
            "concurrency": 2,
        },
        timeout=30,
    )
    assert created.status_code == 202, created.text
    experiment_id = created.json()["id"]
    events = f"{service.base_url}/v1/experiments/{experiment_id}/events"
    problems: list[str] = []
    with (
        httpx.Client(timeout=None) as client,
        client.stream("GET", events) as held,  # the tenant's one stream: the page gets a 429
        sync_playwright() as playwright,
    ):
        assert held.status_code == 200
        browser = launch(playwright)
        try:
            page = watched_page(browser, problems, console_errors=True, dialogs=True)
            page.goto(f"{service.base_url}/#/experiments/{experiment_id}")
            expect(page.locator("#conn")).to_have_text("updating every 2 s", timeout=WAIT_MS)
            bar = page.locator(".exp-arm-progress[data-arm='slow'] .counts")
            expect(bar).to_contain_text("2 running", timeout=WAIT_MS)  # polled, not streamed
            page.click("#exp-cancel")
            expect(page.locator("#exp-status")).to_have_text("cancelled", timeout=WAIT_MS)
            # The experiment is cancelled at once, its running items as their tasks stop.
            expect(bar).to_have_text("4 cancelled · of 4", timeout=WAIT_MS)
            expect(page.locator("#exp-cancel")).to_have_count(0)
            expect(page.locator("#conn")).to_have_text("cancelled")
            arm = page.locator(".exp-arms-table tr[data-arm='slow']")
            expect(arm.locator("[data-field=n]")).to_have_text("0", timeout=WAIT_MS)
        finally:
            browser.close()
    assert get(service, f"/v1/experiments/{experiment_id}")["status"] == "cancelled"
    # The refused stream requests are the only console errors.
    assert problems, "the page never asked for its event stream"
    assert all("429" in p for p in problems), problems


def test_the_bar_tells_an_agents_errors_from_items_the_service_could_not_score(
    service: Service, scripted_llm: ScriptedLLMServer
) -> None:
    """Row 1 right, row 2 an agent that ends without an answer (an agent error: scores 0),
    and an arm whose model the server does not know (infrastructure: not scored)."""
    model = f"exp-page-mixed-{uuid.uuid4().hex[:8]}"
    copy = "cp /testbed/input/a.txt /testbed/output/answer.txt"
    scripted_llm.add_script(
        model, Script([Turn("execute_bash", {"command": copy}), Turn("submit")])
    )
    rows = [
        {
            "id": "r1",
            "problem_statement": "2+2?",
            "ground_truth": "4",
            "input_files": {"a.txt": "4"},
        },
        {"id": "r2", "problem_statement": "2+2?", "ground_truth": "4"},  # nothing to copy
    ]
    created = httpx.post(
        f"{service.base_url}/v1/experiments",
        json={
            "name": "errors apart",
            "dataset": {"rows": rows},
            "arms": [
                {"name": "mixed", "task": {"llm": {"model": model}}},
                {"name": "down", "mode": "vanilla", "task": {"llm": {"model": "no-such-model"}}},
            ],
            "scorer": {"kind": "exact"},
            "concurrency": 1,
            "infrastructure_retries": 0,
        },
        timeout=30,
    )
    assert created.status_code == 202, created.text
    experiment_id = created.json()["id"]
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = watched_page(browser, problems, console_errors=True, dialogs=True)
            page.goto(f"{service.base_url}/#/experiments/{experiment_id}")
            expect(page.locator("#exp-status")).to_have_text("finished", timeout=WAIT_MS)
            mixed = page.locator(".exp-arm-progress[data-arm='mixed']")
            down = page.locator(".exp-arm-progress[data-arm='down']")
            expect(mixed.locator(".counts")).to_have_text("1 scored · 1 error · of 2")
            expect(down.locator(".counts")).to_have_text("2 not scored · of 2")
            expect(down).to_have_attribute("data-done", "2")  # ended, so the bar is full
            segment = down.locator(".seg.not-scored")
            expect(segment).to_have_attribute("title", "not-scored: 2")
            looks = segment.evaluate("node => getComputedStyle(node).backgroundColor")
            error = mixed.locator(".seg.error").evaluate(
                "node => getComputedStyle(node).backgroundColor"
            )
            assert looks not in (error, "rgba(0, 0, 0, 0)"), (looks, error)
            width = segment.evaluate("node => node.getBoundingClientRect().width")
            whole = down.locator(".exp-bar").evaluate("node => node.clientWidth")
            assert width == pytest.approx(whole, abs=1)
            # Each segment fills the bar's height (the page's `.error` message style once
            # gave the error segment a margin that left a hairline).
            for bar, status in ((mixed, "scored"), (mixed, "error"), (down, "not-scored")):
                box = bar.locator(f".seg.{status}").bounding_box()
                frame = bar.locator(".exp-bar").bounding_box()
                assert box is not None
                assert frame is not None
                assert box["y"] >= frame["y"], status
                assert box["height"] >= frame["height"] - 2.5, status
            page.locator(".exp-progress").screenshot(
                path=str(SCREENSHOT_DIR / "sandhive-experiment-not-scored.png")
            )
        finally:
            browser.close()
    assert problems == []
    progress = get(service, f"/v1/experiments/{experiment_id}")["progress"]
    assert (progress["down"]["error"], progress["down"]["not_scored"]) == (2, 2)
    assert (progress["mixed"]["error"], progress["mixed"]["not_scored"]) == (1, 0)
