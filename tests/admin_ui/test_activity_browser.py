"""The workbench's Activity page in the real browser: the live table, the two uPlot charts and a
loading model's progress bar; a screenshot is saved to /tmp/activity.png."""
from __future__ import annotations

import shutil
import threading

import httpx
import pytest
from playwright.sync_api import expect

from tests.admin_ui.helpers import AUTH, logged_in_page

LIVE = 10_000  # ms


@pytest.fixture
def page(browser, embedded_workbench):
    with logged_in_page(browser, embedded_workbench, "/admin/llm-pool/activity/") as page:
        yield page


def test_the_activity_page_shows_requests_charts_and_a_load_in_progress(page, embedded_workbench, screenshot_dir):
    service = embedded_workbench
    with httpx.Client(base_url=service.url, timeout=30, headers=AUTH) as http:
        assert http.post("/v1/admin/models/sse-other/load").status_code == 200
        try:
            for word in ("one", "two", "three"):
                answer = http.post("/v1/chat/completions", json={
                    "model": "sse-other", "messages": [{"role": "user", "content": f"say {word} please"}]})
                assert answer.status_code == 200, answer.text
            expect(page.locator("h1")).to_contain_text("Activity")
            rows = page.locator("[data-activity-rows] tr[data-model=sse-other]")
            expect(rows).to_have_count(3, timeout=LIVE)
            expect(rows.first.locator("td").nth(4)).to_have_text("200")
            expect(page.locator("[data-chart=tokens] .u-legend")).to_contain_text("sse-other", timeout=LIVE)
            expect(page.locator("[data-chart=tokens] canvas")).to_have_count(1)
            expect(page.locator("[data-chart=memory] canvas")).to_have_count(1)
            loading = threading.Thread(target=lambda: httpx.post(
                service.url + "/v1/admin/models/stub-slow/load", headers=AUTH, timeout=30))
            loading.start()
            bar = page.locator(".load-progress[data-model=stub-slow]")
            expect(bar).to_contain_text("stub_loading", timeout=LIVE)
            page.screenshot(path=str(screenshot_dir / "activity.png"), full_page=True)
            shutil.copy(screenshot_dir / "activity.png", "/tmp/activity.png")
            loading.join(30)
            expect(bar).to_have_count(0, timeout=LIVE)
        finally:
            http.post("/v1/admin/models/stub-slow/unload")
            assert http.post("/v1/admin/models/sse-other/unload").status_code == 200


def test_an_empty_window_draws_placeholder_charts_without_a_script_error(page):
    """No answered request in the window and no device: each chart gets its placeholder series.
    uPlot was given a series without a data array for it, and threw from its redraw (a page
    error, seen when a poll came before any request was answered)."""
    page.route("**/activity/?fragment=json",
               lambda route: route.fulfill(json={"requests": [], "loading": [], "devices": {}}))
    page.reload()
    root = page.locator("#activity-main")
    expect(root).to_have_attribute("data-updated", "1", timeout=LIVE)
    page.evaluate("new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")
    expect(page.locator("[data-chart=tokens] .u-legend")).to_contain_text("(no requests)")
    expect(page.locator("[data-chart=memory] .u-legend")).to_contain_text("(no devices)")
    expect(page.locator("[data-activity-status]")).to_contain_text("0 recent requests")
    # The page fixture fails the test on any page error.
