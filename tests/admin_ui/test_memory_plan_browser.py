"""Issue 18 in the workbench, in the real browser: the GPU memory page's bar per device (each
model's charge, free) and the load form's memory plan (fits / would evict X / blocked by Y) shown
before the operator confirms; stub models charge ``stub_vram_mib`` on a 1000 MiB ``cpu`` budget."""
from __future__ import annotations

import json

import httpx
import pytest
from playwright.sync_api import expect

from tests.admin_ui.helpers import AUTH, TOKEN, create_superuser, logged_in_page
from tests.conftest import LiveService, write_settings

LIVE = 10_000  # ms
MODELS = {
    "mem-pinned": {"backend": "stub", "stub_vram_mib": 300, "pinned": True},
    "mem-a": {"backend": "stub", "stub_vram_mib": 400},
    "mem-small": {"backend": "stub", "stub_vram_mib": 100},
    "mem-mid": {"backend": "stub", "stub_vram_mib": 600},
    "mem-big": {"backend": "stub", "stub_vram_mib": 900},
}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    folder = tmp_path_factory.mktemp("memory-plan")
    path = write_settings(folder, MODELS, service={"admin_token": TOKEN})
    data = json.loads(path.read_text())
    data["memory"] = {"devices": {"cpu": {"budget_mib": 1000, "reserve_mib": 0}}, "eviction": "idle_lru"}
    path.write_text(json.dumps(data))
    live = LiveService(path, folder / "db.sqlite3", mode="embedded").start()
    try:
        live.staff = create_superuser(live)
        yield live
    finally:
        assert live.stop() == 0


@pytest.fixture
def page(browser, service):
    with logged_in_page(browser, service, "/admin/llm-pool/gpu/") as page:
        yield page


def state_of(http: httpx.Client, name: str) -> str:
    [entry] = [m for m in http.get("/v1/admin/models").json()["models"] if m["name"] == name]
    return entry["runtime_state"]


def test_device_bars_and_the_plan_before_a_load(page, service, screenshot_dir):
    with httpx.Client(base_url=service.url, timeout=30, headers=AUTH) as http:
        for name in ("mem-pinned", "mem-a"):
            assert http.post(f"/v1/admin/models/{name}/load").json()["runtime_state"] == "loaded"
        # The GPU memory page: cpu's bar, a segment per model's charge and the free rest.
        page.reload()
        cpu = page.locator(".device-memory[data-device=cpu]")
        expect(cpu.locator("h3")).to_contain_text("budget 1000 MiB")
        expect(cpu.locator("[data-charge=mem-pinned]")).to_have_attribute("data-mib", "300")
        expect(cpu.locator("[data-charge=mem-a]")).to_have_attribute("data-mib", "400")
        expect(cpu.locator("[data-charge=mem-a]")).to_have_attribute("style", "width: 40.0%")
        expect(cpu.locator("[data-free]")).to_have_attribute("data-mib", "300")
        expect(cpu.locator("[data-device-text]")).to_contain_text("free 300 MiB")

        # Fits: Load shows the plan first; nothing is loaded until Confirm.
        page.goto(service.url + "/admin/llm-pool/models/mem-small/")
        page.click("[data-load-submit]")
        plan = page.locator("[data-load-plan] [data-plan]")
        expect(plan).to_have_attribute("data-verdict", "fits", timeout=LIVE)
        expect(plan).to_contain_text("Fits: needs 100 MiB, 300 MiB free.")
        expect(plan.locator(".device-memory[data-device=cpu] [data-needed]")).to_have_attribute("data-mib", "100")
        assert state_of(http, "mem-small") == "unloaded"
        page.click("[data-plan-confirm]")
        expect(page.locator("[data-messages]")).to_contain_text("mem-small is loaded", timeout=LIVE)
        expect(page.locator("[data-plan-actions]")).to_be_hidden()
        assert state_of(http, "mem-small") == "loaded"

        # Blocked: 900 MiB cannot be freed while mem-pinned holds 300; no confirm.
        page.goto(service.url + "/admin/llm-pool/models/mem-big/")
        page.click("[data-plan-check]")
        expect(plan).to_have_attribute("data-verdict", "blocked", timeout=LIVE)
        expect(plan).to_contain_text("Blocked by mem-pinned (300 MiB): pinned.")
        expect(plan).to_contain_text("Needs 900 MiB, 200 MiB free.")
        expect(page.locator("[data-plan-confirm]")).to_be_disabled()
        page.click("[data-plan-cancel]")
        expect(page.locator("[data-load-plan] [data-plan]")).to_have_count(0)
        assert state_of(http, "mem-big") == "unloaded"

        # Would evict: 600 MiB fits once the least recently used idle model that frees enough goes.
        page.goto(service.url + "/admin/llm-pool/models/mem-mid/")
        page.click("[data-load-submit]")
        expect(plan).to_have_attribute("data-verdict", "evict", timeout=LIVE)
        expect(plan).to_contain_text("Fits once these idle models are unloaded: mem-a (400 MiB).")
        page.screenshot(path=str(screenshot_dir / "memory_plan.png"), full_page=True)
        assert state_of(http, "mem-a") == "loaded"
        expect(page.locator("[data-plan-confirm]")).to_have_text("Evict and load")
        page.click("[data-plan-confirm]")
        expect(page.locator("[data-messages]")).to_contain_text("mem-mid is loaded", timeout=LIVE)
        assert state_of(http, "mem-a") == "unloaded"

        page.goto(service.url + "/admin/llm-pool/gpu/")
        expect(cpu.locator("[data-charge=mem-mid]")).to_have_attribute("data-mib", "600")
        expect(cpu.locator("[data-charge=mem-a]")).to_have_count(0)
        page.screenshot(path=str(screenshot_dir / "device_bars.png"), full_page=True)
        for name in MODELS:
            http.post(f"/v1/admin/models/{name}/unload")
