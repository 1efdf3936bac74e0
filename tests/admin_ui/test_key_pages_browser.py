"""The workbench's key pages in the real browser: a key made through the form (its secret shown
once), used, its page showing its limits, budget and usage with the chart, disabled and enabled
(the service refuses and takes it again), a form with a bad limit refused with nothing stored, and
the key deleted; a screenshot of each page is saved."""
from __future__ import annotations

import time

import httpx
import pytest
from playwright.sync_api import expect

from models_app.quotas.usage import FLUSH_SECONDS
from tests.admin_ui.helpers import AUTH, logged_in_page

MODEL = "sse-other"


@pytest.fixture
def page(browser, embedded_workbench):
    with logged_in_page(browser, embedded_workbench, "/admin/llm-pool/keys/") as page:
        yield page


@pytest.fixture
def http(embedded_workbench):
    """The admin API; every key of the database is deleted afterwards (a key left would close the
    service to the other browser tests, which call without one)."""
    with httpx.Client(base_url=embedded_workbench.url, timeout=30, headers=AUTH) as client:
        assert client.post(f"/v1/admin/models/{MODEL}/load").status_code == 200
        try:
            yield client
        finally:
            for key in client.get("/v1/admin/keys").json()["keys"]:
                if key["source"] == "api":
                    client.delete(f"/v1/admin/keys/{key['id']}")
            client.post(f"/v1/admin/models/{MODEL}/unload")


def chat(url: str, secret: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {secret}"}, timeout=30,
                      json={"model": MODEL, "messages": [{"role": "user", "content": "three words here"}]})


def test_a_key_is_made_used_shown_disabled_enabled_and_deleted_from_its_pages(page, http, embedded_workbench,
                                                                             screenshot_dir):
    url = embedded_workbench.url
    expect(page.locator("h1")).to_contain_text("Inference keys")
    page.fill("#key-name", "bad-limit")
    page.fill("#key-rpm", "lots")
    page.click("[data-key-create] input[type=submit]")
    expect(page.locator("[data-key-error]")).to_contain_text("invalid_request")
    expect(page.locator("[data-key-error]")).to_contain_text("requests_per_minute")
    assert [key["name"] for key in http.get("/v1/admin/keys").json()["keys"]] == []

    page.fill("#key-name", "team-a")
    page.fill("#key-rpm", "100")
    page.fill("#key-budget", "100000")
    page.select_option("#key-period", "day")
    page.click("[data-key-create] input[type=submit]")
    secret = page.locator("[data-key-secret]").inner_text()
    assert secret.startswith("sk-llmpool-")
    page.screenshot(path=str(screenshot_dir / "key_created.png"), full_page=True)
    expect(page.locator("[data-key-row=team-a] [data-key-state]")).to_have_text("enabled")

    answer = chat(url, secret)
    assert answer.status_code == 200 and answer.headers["x-ratelimit-remaining-requests"] == "99"
    used = answer.json()["usage"]

    page.click("text=Open the key's page")
    expect(page.locator("[data-limit=requests_per_minute]")).to_have_text("100")
    deadline = time.monotonic() + 2 * FLUSH_SECONDS + 2
    row = page.locator(f"[data-usage-row$=' {MODEL}']")
    while row.count() == 0 and time.monotonic() < deadline:  # written by the next flush
        time.sleep(0.3)
        page.reload()
    expect(row.locator("[data-usage-in]")).to_have_text(str(used["prompt_tokens"]))
    expect(row.locator("[data-usage-out]")).to_have_text(str(used["completion_tokens"]))
    expect(page.locator("[data-key-budget]")).to_contain_text(f"{used['total_tokens']} of 100000 tokens used")
    today = row.get_attribute("data-usage-row").split(" ")[0]
    bar_heights = page.locator(f"[data-usage-chart] g[data-day='{today}'] rect").evaluate_all(
        "rects => rects.map(rect => Number(rect.getAttribute('height')))")
    assert sum(bar_heights) == 80  # the busiest day is the chart's full height
    page.screenshot(path=str(screenshot_dir / "key_page.png"), full_page=True)

    page.click("[data-key-actions] input[value=disable]")
    expect(page.locator("[data-key-state]")).to_have_text("disabled")
    assert chat(url, secret).status_code == 401
    page.click("[data-key-actions] input[value=enable]")
    expect(page.locator("[data-key-state]")).to_have_text("enabled")
    assert chat(url, secret).status_code == 200

    key_id = page.locator("[data-key-id]").get_attribute("data-key-id")
    page.click("[data-key-actions] input[value=delete]")
    expect(page.locator("h1")).to_contain_text("Inference keys")
    expect(page.locator("[data-key-row=team-a]")).to_have_count(0)
    assert http.get(f"/v1/admin/keys/{key_id}").status_code == 404
