"""The workbench shows how a model switches by itself: its group, the TTL countdown, and the
reason of each transition in the model page's live feed (Chromium driven by Playwright)."""
from __future__ import annotations

import json

import httpx
import pytest
from playwright.sync_api import expect

from tests.admin_ui.helpers import TOKEN, create_superuser
from tests.conftest import LiveService, write_settings

LIVE = 10_000  # ms
MODELS = {
    "sw-ttl": {"backend": "stub", "stub_reply": "hi there", "load_on_request": True, "ttl_seconds": 30},
    "sw-other": {"backend": "stub", "load_on_request": True},
}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    folder = tmp_path_factory.mktemp("workbench_switching")
    path = write_settings(folder, MODELS, service={"admin_token": TOKEN})
    data = json.loads(path.read_text())
    data["groups"] = {"gpu0": {"members": ["sw-ttl", "sw-other"], "max_loaded": 1}}
    path.write_text(json.dumps(data))
    live = LiveService(path, folder / "db.sqlite3", mode="embedded").start()
    try:
        live.staff = create_superuser(live)
        yield live
    finally:
        live.stop()


def test_the_model_page_shows_group_countdown_and_reasons(browser, service):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    try:
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(service.url + "/admin/llm-pool/models/sw-ttl/")
        page.fill("#id_username", service.staff["username"])
        page.fill("#id_password", service.staff["password"])
        page.click("input[type=submit]")
        expect(page.locator("[data-live] [data-field=group]")).to_have_text("group gpu0")
        expect(page.locator("[data-live] [data-field=ttl_countdown]")).to_have_text("not counting")
        page.wait_for_timeout(1000)  # the live WebSocket is connected
        answer = httpx.post(service.url + "/v1/responses", json={"model": "sw-ttl", "input": "x"}, timeout=30)
        assert answer.status_code == 200, answer.text
        feed = page.locator("[data-transition-feed] li")
        expect(feed.first).to_contain_text("loading \u2192 loaded (request)", timeout=LIVE)
        expect(feed.nth(1)).to_contain_text("unloaded \u2192 loading (request)")
        expect(page.locator("[data-live] [data-field=ttl_countdown]")).to_contain_text(
            "idle, unloads in", timeout=LIVE
        )
        expect(page.locator("[data-live] [data-field=last_reason]")).to_have_text("request")
        # a request for the other member swaps this one out: the feed says why
        assert httpx.post(service.url + "/v1/responses", json={"model": "sw-other", "input": "x"},
                          timeout=30).status_code == 200
        expect(feed.first).to_contain_text("unloading \u2192 unloaded (group_swap)", timeout=LIVE)
        expect(page.locator("[data-live] [data-field=ttl_countdown]")).to_have_text("not counting", timeout=LIVE)
        models = context.new_page()
        models.goto(service.url + "/admin/llm-pool/models/")
        expect(models.locator("tr[data-model=sw-other] [data-field=group]")).to_have_text("group gpu0")
    finally:
        context.close()
    assert not errors, errors
