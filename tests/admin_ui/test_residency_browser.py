"""Issue 19 in the workbench, in the real browser: a loaded model's Sleep / Wake buttons (by its
``residency``) and its Reconfigure form (the ``"reconfigurable": true`` constraints, prefilled
with the effective values, the runtime's errors on the fields as the Load form shows them).

Stubs on an 800 MiB ``cpu`` budget without eviction: ``res-sleepy`` holds 300 MiB awake and 50
asleep, so once ``res-filler`` (700) is loaded its wake is refused (409 insufficient_memory) and
it stays asleep; a real SmolLM2 (llama_cpp) is reconfigured from 2048 to 1024 tokens."""
from __future__ import annotations

import json
import re

import httpx
import pytest
from playwright.sync_api import expect

from tests.admin_ui.helpers import AUTH, TOKEN, create_superuser, logged_in_page
from tests.conftest import LiveService, write_settings
from tests.llama_cpp.llama_helpers import SMOLLM2_MODEL

LIVE = 15_000  # ms
MODELS = {
    "res-sleepy": {"backend": "stub", "stub_vram_mib": 300, "stub_sleep_mib": 50},
    "res-filler": {"backend": "stub", "stub_vram_mib": 700},
    "res-plain": {"backend": "stub", "stub_vram_mib": 10},
    "res-smol": {**SMOLLM2_MODEL, "gguf_n_ctx": 2048},
}
CSRF_INPUT = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    folder = tmp_path_factory.mktemp("residency")
    path = write_settings(folder, MODELS, service={"admin_token": TOKEN})
    data = json.loads(path.read_text())
    data["memory"] = {"devices": {"cpu": {"budget_mib": 800, "reserve_mib": 0}}, "eviction": "none"}
    path.write_text(json.dumps(data))
    live = LiveService(path, folder / "db.sqlite3", mode="embedded").start()
    try:
        live.staff = create_superuser(live)
        yield live
    finally:
        assert live.stop() == 0


@pytest.fixture
def http(service):
    with httpx.Client(base_url=service.url, timeout=60, headers=AUTH) as client:
        yield client


@pytest.fixture
def page(browser, service):
    with logged_in_page(browser, service, "/admin/llm-pool/models/", height=1400) as page:
        yield page


def entry_of(http: httpx.Client, name: str) -> dict:
    [entry] = [m for m in http.get("/v1/admin/models").json()["models"] if m["name"] == name]
    return entry


def test_sleep_then_a_wake_refused_for_memory_then_a_wake(page, service, http, screenshot_dir):
    assert http.post("/v1/admin/models/res-sleepy/load").json()["runtime_state"] == "loaded"
    try:
        page.goto(service.url + "/admin/llm-pool/models/res-sleepy/")
        module = page.locator("#residency-module")
        expect(module.locator("[data-field=residency]")).to_have_text("active")
        expect(module.locator("[data-wake-submit]")).to_have_count(0)
        expect(module.locator("[data-reconfigure-form]")).to_have_count(0)  # the stub has no reconfigurable field

        module.locator("[data-sleep-submit]").click()
        expect(page.locator("[data-messages] li.success")).to_contain_text("res-sleepy is sleeping", timeout=LIVE)
        expect(module.locator("[data-field=residency]")).to_have_text("sleeping")
        expect(module).to_have_attribute("data-residency", "sleeping")
        assert entry_of(http, "res-sleepy")["memory"]["charge_mib"] == {"cpu": 50}

        # 750 of 800 MiB held: waking needs 300 with 100 free, and there is no eviction.
        assert http.post("/v1/admin/models/res-filler/load").json()["runtime_state"] == "loaded"
        plan = {"device": "cpu", "needed_mib": 300, "free_mib": 100,
                "evictable": [{"name": "res-filler", "charge_mib": 700}], "blocking": []}
        refused = http.post("/v1/admin/models/res-sleepy/wake")
        assert refused.status_code == 409
        assert (refused.json()["error"]["code"], refused.json()["error"]["details"]) == ("insufficient_memory", plan)
        asked = http.post("/v1/chat/completions", json={"model": "res-sleepy", "messages": [
            {"role": "user", "content": "hello"}]})
        assert asked.status_code == 409  # a request that would wake it: the same refusal
        assert (asked.json()["error"]["code"], asked.json()["error"]["details"]) == ("insufficient_memory", plan)
        module.locator("[data-wake-submit]").click()
        error = page.locator("[data-messages] li.error")
        expect(error).to_contain_text("insufficient_memory: model res-sleepy needs 300 MiB on cpu to wake but 100 MiB",
                                      timeout=LIVE)
        expect(module.locator("[data-field=residency]")).to_have_text("sleeping")
        expect(module.locator("[data-wake-submit]")).to_be_enabled()
        page.screenshot(path=str(screenshot_dir / "residency-wake-refused.png"), full_page=True)
        entry = entry_of(http, "res-sleepy")
        assert (entry["runtime_state"], entry["residency"], entry["memory"]["charge_mib"]) == (
            "loaded", "sleeping", {"cpu": 50}
        )

        assert http.post("/v1/admin/models/res-filler/unload").json()["runtime_state"] == "unloaded"
        module.locator("[data-wake-submit]").click()
        expect(page.locator("[data-messages] li.success")).to_contain_text("res-sleepy is active", timeout=LIVE)
        expect(module.locator("[data-field=residency]")).to_have_text("active")
        expect(module.locator("[data-sleep-submit]")).to_be_visible()
        assert entry_of(http, "res-sleepy")["residency"] == "active"
    finally:
        http.post("/v1/admin/models/res-filler/unload")
        http.post("/v1/admin/models/res-sleepy/unload")


def test_no_residency_module_unless_loaded_and_allowed(page, service, http):
    page.goto(service.url + "/admin/llm-pool/models/res-sleepy/")
    expect(page.locator("#load-module")).to_be_visible()
    expect(page.locator("#residency-module")).to_have_count(0)  # not loaded
    assert http.post("/v1/admin/models/res-plain/load").json()["runtime_state"] == "loaded"
    try:
        page.goto(service.url + "/admin/llm-pool/models/res-plain/")
        expect(page.locator("[data-field=runtime_state]").first).to_have_text("loaded")
        expect(page.locator("#residency-module")).to_have_count(0)  # cannot sleep, nothing reconfigurable
    finally:
        http.post("/v1/admin/models/res-plain/unload")


def test_reconfigure_a_real_llama_cpp_model(page, service, http, screenshot_dir):
    assert http.post("/v1/admin/models/res-smol/load").json()["runtime_state"] == "loaded"
    try:
        held = hold_the_live_refresh(page, service.url + "/admin/llm-pool/models/res-smol/")
        form = page.locator("[data-reconfigure-form]")
        context = form.locator("#id_reconfigure-gguf_n_ctx")
        expect(context).to_have_value("2048")  # the effective values
        expect(form.locator("#id_reconfigure-gguf_flash_attn")).to_have_value("auto")
        expect(form.locator("#id_reconfigure-gguf_type_k__null")).to_be_checked()
        expect(form.locator("#id_reconfigure-gguf_type_k")).to_be_disabled()
        # gguf_n_ctx, gguf_flash_attn, gguf_type_k, gguf_type_v and adapters_loaded (the speculative
        # overrides are load-time only)
        expect(form.locator("[data-row]")).to_have_count(5)
        expect(form.locator("#id_reconfigure-adapters_loaded")).to_have_count(1)
        expect(page.locator("#residency-module [data-sleep-submit]")).to_be_visible()  # llama_cpp can sleep

        # The live feed's refresh of the fragment, asked before the operator types and answered
        # after, leaves the edit alone (it used to redraw the form with 2048 under their hands).
        context.fill("0")
        release_the_live_refresh(page, held)
        expect(context).to_have_value("0")

        # The runtime's refusal, on the field it names; nothing changes.
        held = hold_the_live_refresh(page, service.url + "/admin/llm-pool/models/res-smol/")
        context.fill("0")
        form.locator("[data-reconfigure-submit]").click()
        row = page.locator("[data-reconfigure-form] .field-gguf_n_ctx.errors")
        expect(row.locator(".errorlist")).to_have_text("invalid_load_body: Input should be greater than or equal to 1",
                                                   timeout=LIVE)
        expect(page.locator("[data-reconfigure-form] .errornote")).to_contain_text("rejected this reconfigure")
        # A refresh asked before the answer and answered after it does not wipe the answer out.
        release_the_live_refresh(page, held)
        expect(row.locator(".errorlist")).to_be_visible()
        expect(page.locator("[data-messages] li.error")).to_be_visible()
        page.screenshot(path=str(screenshot_dir / "residency-reconfigure-error.png"), full_page=True)
        assert entry_of(http, "res-smol")["load_override"] == {}

        page.locator("[data-reconfigure-form] #id_reconfigure-gguf_n_ctx").fill("1024")
        page.locator("[data-reconfigure-form] [data-reconfigure-submit]").click()
        expect(page.locator("[data-messages] li.success")).to_contain_text(
            "res-smol reconfigured in", timeout=LIVE
        )
        expect(page.locator("[data-messages] li.success")).to_contain_text("gguf_n_ctx 2048 → 1024")
        expect(page.locator("[data-reconfigure-form] #id_reconfigure-gguf_n_ctx")).to_have_value("1024")
        expect(page.locator("[data-reconfigure-form] .errorlist")).to_have_count(0)
        entry = entry_of(http, "res-smol")
        assert (entry["runtime_state"], entry["load_override"]) == ("loaded", {"gguf_n_ctx": 1024})
    finally:
        http.post("/v1/admin/models/res-smol/unload")


def hold_the_live_refresh(page, url):
    """Open the model page with the residency fragment's first live refresh (the one the
    WebSocket's snapshot asks for) held back; returns the held request."""
    held = []

    def hold(route):
        if held:
            route.continue_()
        else:
            held.append(route)

    page.unroute_all()
    page.route("**/?fragment=residency", hold)
    page.goto(url)
    expect(page.locator("[data-live-status]")).to_have_text("live", timeout=LIVE)
    for _ in range(LIVE // 50):
        if held:
            break
        page.wait_for_timeout(50)
    assert held, "the snapshot asked for no refresh of the residency fragment"
    return held


def release_the_live_refresh(page, held):
    """Let the held refresh through and wait until the page has dealt with its answer."""
    before = int(page.locator("[data-residency-url]").get_attribute("data-refreshes") or 0)
    held.pop().continue_()
    expect(page.locator("[data-residency-url]")).to_have_attribute("data-refreshes", str(before + 1), timeout=LIVE)


def test_the_actions_need_the_staff_login_and_the_csrf_token(service):
    with httpx.Client(base_url=service.url, timeout=30) as anonymous:  # a CSRF token, but no login
        token = CSRF_INPUT.search(anonymous.get("/admin/login/").text).group(1)
        for action in ("sleep", "wake", "reconfigure"):
            path = f"/admin/llm-pool/models/res-sleepy/{action}"
            answer = anonymous.post(path, data={"csrfmiddlewaretoken": token})
            assert (answer.status_code, answer.headers["location"]) == (302, f"/admin/login/?next={path}")
    with httpx.Client(base_url=service.url, timeout=30) as client:
        login = client.get("/admin/login/")
        client.post("/admin/login/", data={
            "username": service.staff["username"], "password": service.staff["password"],
            "csrfmiddlewaretoken": CSRF_INPUT.search(login.text).group(1), "next": "/admin/",
        })
        refused = client.post("/admin/llm-pool/models/res-sleepy/sleep", data={})
        assert refused.status_code == 403  # no CSRF token
        # Without JavaScript: a redirect to the model page with the runtime's answer as a message.
        page = client.get("/admin/llm-pool/models/res-sleepy/")
        answer = client.post("/admin/llm-pool/models/res-sleepy/sleep",
                             data={"csrfmiddlewaretoken": CSRF_INPUT.search(page.text).group(1)})
        assert answer.status_code == 302 and answer.headers["location"] == "/admin/llm-pool/models/res-sleepy/"
        shown = client.get(answer.headers["location"])
        assert "model_not_loaded: model res-sleepy is unloaded" in shown.text.lower()  # the admin capitalizes
