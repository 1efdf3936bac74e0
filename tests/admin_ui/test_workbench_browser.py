"""The operator's workbench in a real browser: Debian's Chromium driven by Playwright against a live service.

One embedded service (module scope) with a superuser made by ``createsuperuser``; every test
works on its own models so the tests do not see each other's state.  Each page is saved as a
screenshot (see ``screenshot_dir``).
"""
from __future__ import annotations

import json
import time

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.admin_ui.helpers import AUTH, WORKBENCH_MODELS as MODELS

LIVE = 10_000  # ms: how long a pushed update may take to show


@pytest.fixture(scope="module")
def workbench(embedded_workbench):
    return embedded_workbench


@pytest.fixture(scope="module")
def login_state(browser, workbench) -> dict:
    """Log in once through the admin login form; tests reuse the session."""
    context = browser.new_context()
    page = context.new_page()
    page.goto(workbench.url + "/admin/llm-pool/models/")
    expect(page).to_have_url(f"{workbench.url}/admin/login/?next=/admin/llm-pool/models/")
    page.fill("#id_username", workbench.staff["username"])
    page.fill("#id_password", workbench.staff["password"])
    page.click("input[type=submit]")
    expect(page.locator("h1")).to_contain_text("Models")
    state = context.storage_state()
    context.close()
    return state


@pytest.fixture
def new_page(browser, login_state):
    """Factory of logged-in pages (a test may open several); all closed afterwards."""
    context = browser.new_context(storage_state=login_state, viewport={"width": 1400, "height": 1000})
    errors: list[str] = []

    def open_page(url: str) -> Page:
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(url)
        return page

    yield open_page
    context.close()
    assert not errors, errors


@pytest.fixture
def api(workbench):
    with workbench.client(timeout=30, headers=AUTH) as client:
        yield client


def shot(page: Page, screenshot_dir, name: str) -> None:
    page.screenshot(path=str(screenshot_dir / f"{name}.png"), full_page=True)


def live_page(new_page, url: str) -> Page:
    page = new_page(url)
    expect(page.locator("[data-live-status]")).to_have_text("live", timeout=LIVE)
    page.evaluate("window.__notReloaded = true")
    return page


def not_reloaded(page: Page) -> bool:
    return page.evaluate("window.__notReloaded === true")


def state_of(scope) -> object:
    return scope.locator("[data-field=runtime_state]").first


# ---- log-in and the list ---------------------------------------------------------------------------


def test_the_workbench_needs_a_staff_login(browser, workbench, screenshot_dir):
    context = browser.new_context()
    page = context.new_page()
    for path in ("/admin/llm-pool/models/", "/admin/llm-pool/models/stub-slow/", "/admin/llm-pool/gpu/",
                 "/admin/llm-pool/settings/"):
        page.goto(workbench.url + path)
        expect(page.locator("#id_username")).to_be_visible()
    shot(page, screenshot_dir, "login")
    context.close()


def test_the_admin_index_links_the_workbench(new_page, workbench, screenshot_dir):
    page = new_page(workbench.url + "/admin/")
    module = page.locator("#llmpool-workbench-module")
    expect(module).to_contain_text("LLM pool workbench")
    shot(page, screenshot_dir, "admin_index")
    module.get_by_role("link", name="Models").click()
    expect(page.locator("h1")).to_contain_text("Models")


def test_the_list_shows_every_model_with_its_state_and_filters(new_page, workbench, screenshot_dir):
    page = live_page(new_page, workbench.url + "/admin/llm-pool/models/")
    rows = page.locator("tr[data-model]")
    expect(rows).to_have_count(len(MODELS))
    slow = page.locator("tr[data-model='stub-slow']")
    expect(state_of(slow)).to_have_text("unloaded")
    expect(slow.locator(".field-replicas")).to_contain_text("0 / 1")
    expect(slow.locator(".field-replicas")).to_contain_text("max 2")
    expect(slow.locator("[data-field=vram]")).to_contain_text("512 MiB")
    expect(slow.locator("[data-field=vram]")).to_contain_text("model_artifact_size")
    expect(page.locator("tr[data-model='gguf-missing'] .field-backend")).to_have_text("llama_cpp")
    shot(page, screenshot_dir, "models_list")

    page.locator("#changelist-filter").get_by_role("link", name="llama_cpp").click()
    expect(page.locator("tr[data-model]")).to_have_count(1)
    expect(page.locator("tr[data-model='gguf-missing']")).to_be_visible()
    page.locator("#changelist-filter").get_by_role("link", name="failed").click()
    expect(page).to_have_url(f"{workbench.url}/admin/llm-pool/models/?backend=llama_cpp&state=failed")
    page.get_by_role("link", name="Clear all filters").click()
    expect(page.locator("tr[data-model]")).to_have_count(len(MODELS))


# ---- load through the form, watch it live, unload, 409 -------------------------------------------------


def test_a_load_through_the_form_is_watched_live_then_unloaded(new_page, workbench, screenshot_dir):
    listing = live_page(new_page, workbench.url + "/admin/llm-pool/models/")
    page = live_page(new_page, workbench.url + "/admin/llm-pool/models/stub-slow/")
    live = page.locator("[data-live]")
    expect(state_of(live)).to_have_text("unloaded")
    page.fill("#id_replicas", "2")
    page.click("[data-load-submit]")
    page.click("[data-plan-confirm]")  # Load shows the memory plan first (a dry run); Confirm loads

    expect(state_of(live)).to_have_text("loading", timeout=LIVE)
    expect(state_of(listing.locator("tr[data-model='stub-slow']"))).to_have_text("loading", timeout=LIVE)
    shot(page, screenshot_dir, "model_loading")
    expect(state_of(live)).to_have_text("loaded", timeout=LIVE)
    expect(live.locator("[data-field=replicas_text]")).to_have_text("2 / 2")
    expect(page.locator("table.effective-values tr[data-key=replicas] [data-effective]")).to_have_text("2")
    listed = listing.locator("tr[data-model='stub-slow']")
    expect(state_of(listed)).to_have_text("loaded", timeout=LIVE)
    expect(listed.locator("[data-field=replicas_text]")).to_have_text("2 / 2")
    expect(listed.locator("[data-field=vram]")).to_contain_text("1024 MiB")
    expect(page.locator("[data-messages]")).to_contain_text("stub-slow is loaded")
    assert not_reloaded(page) and not_reloaded(listing)
    shot(page, screenshot_dir, "model_loaded")

    page.click("[data-unload-submit]")
    expect(state_of(live)).to_have_text("unloading", timeout=LIVE)
    page.click("[data-load-submit]")  # loading while unloading: the plan, then the load's 409, shown on the form
    page.click("[data-plan-confirm]")
    expect(page.locator("[data-load-form] .errorlist.nonfield")).to_contain_text("model_state_conflict")
    expect(page.locator("[data-load-form] .errornote")).to_be_visible()
    expect(state_of(live)).to_have_text("unloaded", timeout=LIVE)
    expect(state_of(listed)).to_have_text("unloaded", timeout=LIVE)
    assert not_reloaded(page) and not_reloaded(listing)


# ---- the constraint-driven form on llama_cpp ------------------------------------------------------------


def test_the_llama_cpp_form_follows_its_constraints_and_keeps_input_on_errors(new_page, workbench, api,
                                                                               screenshot_dir):
    entry = next(m for m in api.get("/v1/admin/models").json()["models"] if m["name"] == "gguf-missing")
    page = live_page(new_page, workbench.url + "/admin/llm-pool/models/gguf-missing/")
    form = page.locator("[data-load-form]")

    n_ctx = form.locator("#id_gguf_n_ctx")
    constraint = entry["load_constraints"]["gguf_n_ctx"]
    expect(n_ctx).to_have_attribute("type", "number")
    expect(n_ctx).to_have_attribute("min", str(constraint["minimum"]))
    expect(n_ctx).to_have_attribute("step", str(constraint["step"]))
    flash = form.locator("select#id_gguf_flash_attn option")
    assert flash.evaluate_all("options => options.map(o => o.value)") == ["", "on", "off", "auto"]
    datalist = form.locator("#gguf_type_k-values option")
    assert datalist.evaluate_all("o => o.map(x => x.value)") == entry["load_constraints"]["gguf_type_k"]["allowed_values"]
    expect(form.locator("#id_gguf_type_k__null")).to_be_visible()
    expect(form.locator("#id_target_inflight")).to_have_count(1)  # llama_cpp batches target_inflight sequences
    # The presets come first, as one-click pairs.
    labels = form.locator("[data-preset]").all_inner_texts()
    assert labels == ["f16/f16", "q8_0/q8_0", "q4_0/q4_0"]
    order = form.locator("[data-presets], .form-row[data-row]").evaluate_all(
        "rows => rows.map(r => r.dataset.row || 'presets')")
    assert order[0] == "presets"

    form.get_by_role("button", name="q8_0/q8_0").click()
    expect(form.locator("#id_gguf_type_k")).to_have_value("q8_0")
    expect(form.locator("#id_gguf_type_v")).to_have_value("q8_0")

    n_ctx.fill("0")  # the body schema refuses it: 422 next to the field
    page.click("[data-load-submit]")
    expect(form.locator(".field-gguf_n_ctx .errorlist")).to_contain_text("invalid_load_body")
    expect(form.locator("#id_gguf_type_k")).to_have_value("q8_0")
    expect(form.locator("#id_gguf_n_ctx")).to_have_value("0")

    form.locator("#id_gguf_n_ctx").fill("8192")
    form.locator("#id_gguf_type_k").fill("q8-0")  # valid JSON, not a GGML type: 400 next to the field
    page.click("[data-load-submit]")
    expect(form.locator(".field-gguf_type_k .errorlist")).to_contain_text("invalid_load_request")
    expect(form.locator(".field-gguf_n_ctx .errorlist")).to_have_count(0)
    expect(form.locator("#id_gguf_n_ctx")).to_have_value("8192")
    expect(form.locator("#id_gguf_type_v")).to_have_value("q8_0")
    shot(page, screenshot_dir, "model_form_errors")

    form.get_by_role("button", name="q4_0/q4_0").click()
    page.click("[data-load-submit]")  # valid: the plan, then the load starts and fails on the missing file
    page.click("[data-plan-confirm]")
    live = page.locator("[data-live]")
    expect(state_of(live)).to_have_text("failed", timeout=LIVE)
    expect(live.locator(".last-error-note")).to_contain_text("/nonexistent/model.gguf")
    expect(page.locator("[data-messages]")).to_contain_text("failed to load")
    expect(form.locator("#id_gguf_type_k")).to_have_value("q4_0")  # ready to retry
    assert not_reloaded(page)
    shot(page, screenshot_dir, "model_failed")


def test_the_model_page_shows_definition_capabilities_and_effective_values(new_page, workbench):
    page = new_page(workbench.url + "/admin/llm-pool/models/gguf-missing/")
    definition = json.loads(page.locator("[data-definition]").inner_text())
    assert definition["model_path"] == "/nonexistent/model.gguf" and definition["gguf_n_ctx"] == 4096
    expect(page.locator("#capabilities-module")).to_contain_text("multi_turn")
    effective = page.locator("table.effective-values")
    expect(effective.locator("tr[data-key=gguf_n_ctx] [data-effective]")).to_have_text("4096")
    expect(effective.locator("tr[data-key=gguf_type_k]")).to_contain_text("runtime default: f16")
    expect(page.locator("#fairness-module")).to_contain_text("No fairness key")


# ---- a failed load from the list's actions ---------------------------------------------------------------


def test_a_failed_load_from_the_actions_shows_last_error_in_the_row(new_page, workbench, screenshot_dir):
    page = live_page(new_page, workbench.url + "/admin/llm-pool/models/")
    broken = page.locator("tr[data-model='stub-broken']")
    listed = page.locator("tr[data-model='stub-list']")
    broken.locator("input.action-select").check()
    listed.locator("input.action-select").check()
    expect(page.locator("[data-selection-counter]")).to_have_text(f"2 of {len(MODELS)} selected")
    page.select_option("select[name=action]", "load")
    page.get_by_role("button", name="Go").click()
    expect(state_of(broken)).to_have_text("failed", timeout=LIVE)
    expect(broken.locator("[data-field=last_error]")).to_contain_text("weights are corrupt")
    expect(broken.locator("[data-field=last_error]")).to_be_visible()
    expect(state_of(listed)).to_have_text("loaded", timeout=LIVE)
    expect(page.locator("[data-messages] li.error")).to_contain_text("stub-broken")
    shot(page, screenshot_dir, "models_failed")

    listed.get_by_role("button", name="Unload", exact=True).click()
    expect(state_of(listed)).to_have_text("unloaded", timeout=LIVE)
    assert not_reloaded(page)


# ---- GPU memory ------------------------------------------------------------------------------------------


def test_the_gpu_page_shows_bars_or_why_there_are_none(new_page, workbench, api, screenshot_dir):
    memory = api.get("/v1/admin/gpu-memory").json()
    page = new_page(workbench.url + "/admin/llm-pool/gpu/")
    expect(page.locator("#vram-estimates tr[data-model]")).to_have_count(len(MODELS))
    expect(page.locator("#vram-estimates tr[data-model='stub-slow']")).to_contain_text("512 MiB")
    if memory["gpus"]:
        expect(page.locator(".gpu-bar")).to_have_count(len(memory["gpus"]))
        expect(page.locator(".gpu-text").first).to_contain_text(memory["gpus"][0]["used_over_total"])
    else:
        expect(page.locator("[data-gpu-error]")).to_contain_text(memory["error"])
    shot(page, screenshot_dir, "gpu_memory")


# ---- settings reload ------------------------------------------------------------------------------------------


def test_settings_reload_shows_the_diff_and_refusals(new_page, workbench, api, screenshot_dir):
    local = workbench.settings_path.with_name("local.json")
    listing = live_page(new_page, workbench.url + "/admin/llm-pool/models/")
    page = new_page(workbench.url + "/admin/llm-pool/settings/")
    try:
        local.write_text(json.dumps({"models": {"added-later": {"backend": "stub"},
                                                "stub-reload": {"stub_reply": "after"}}}))
        page.get_by_role("button", name="Reload settings").click()
        result = page.locator("[data-reload-result]")
        expect(result.locator("[data-diff=added]")).to_have_text("added-later")
        expect(result.locator("[data-diff=updated]")).to_have_text("stub-reload")
        expect(result.locator("[data-diff=removed]")).to_have_text("none")
        expect(result.locator("[data-diff=unchanged]")).to_contain_text("stub-slow")
        expect(result.locator("[data-diff=service_restart_required]")).to_have_text("no")
        shot(page, screenshot_dir, "settings_reloaded")
        # The open list learns about the new model without a reload.
        expect(listing.locator("tr[data-model='added-later']")).to_be_visible(timeout=LIVE)
        assert not_reloaded(listing)

        assert api.post("/v1/admin/models/stub-reload/load").json()["runtime_state"] == "loaded"
        local.write_text(json.dumps({"models": {"added-later": {"backend": "stub"},
                                                "stub-reload": {"stub_reply": "changed while loaded"}}}))
        page.get_by_role("button", name="Reload settings").click()
        error = page.locator("[data-reload-error]")
        expect(error).to_contain_text("settings_reload_conflict")
        expect(error).to_contain_text("HTTP 409")
        expect(error).to_contain_text("stub-reload")
        expect(error).to_contain_text("The catalog is unchanged.")
        shot(page, screenshot_dir, "settings_conflict")

        local.write_text("{ not json")
        page.get_by_role("button", name="Reload settings").click()
        expect(page.locator("[data-reload-error]")).to_contain_text("invalid_settings")
        expect(page.locator("[data-reload-error]")).to_contain_text("HTTP 400")
        models = {m["name"] for m in api.get("/v1/admin/models").json()["models"]}
        assert "added-later" in models
    finally:
        local.unlink(missing_ok=True)
        api.post("/v1/admin/models/stub-reload/unload")
        assert api.post("/v1/admin/settings/reload").status_code == 200


# ---- the production split ---------------------------------------------------------------------------------------


def test_split_mode_pages_are_live_and_the_api_answers_meanwhile(browser, split_workbench, screenshot_dir):
    """Over Redis, an open admin WebSocket shares the API process's receive loop with every API call."""
    service = split_workbench
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(service.url + "/admin/llm-pool/models/")
        page.fill("#id_username", service.staff["username"])
        page.fill("#id_password", service.staff["password"])
        page.click("input[type=submit]")
        expect(page.locator("[data-live-status]")).to_have_text("live", timeout=LIVE)
        started = time.monotonic()
        assert httpx.get(service.url + "/v1/admin/models", headers=AUTH, timeout=10).status_code == 200
        assert time.monotonic() - started < 1.5
        row = page.locator("tr[data-model='stub-list']")
        row.get_by_role("button", name="Load", exact=True).click()
        expect(state_of(row)).to_have_text("loading", timeout=LIVE)
        expect(state_of(row)).to_have_text("loaded", timeout=LIVE)
        shot(page, screenshot_dir, "models_split_mode")
        row.get_by_role("button", name="Unload", exact=True).click()
        expect(state_of(row)).to_have_text("unloaded", timeout=LIVE)
    finally:
        context.close()
