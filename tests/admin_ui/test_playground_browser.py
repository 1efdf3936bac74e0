"""The model page's playground and live log pane in the real browser (Debian's Chromium).

A service of its own with ``service.api_keys`` set: the playground asks for a key, streams a
stub's exact reply through POST /v1/chat/completions and shows time to first token, tokens/s
and the token counts; an unloaded model is said to be so, a ``load_on_request`` one loads and
answers; the log pane shows a managed (fake sglang) server's output and its new lines live."""
from __future__ import annotations

import sys

import httpx
import pytest
from playwright.sync_api import expect

from models_app.api.keys import hash_key
from tests.admin_ui.helpers import AUTH, TOKEN, create_superuser
from tests.conftest import LiveService, write_settings
from tests.managed.helpers import FAKES, TARGET

LIVE = 10_000  # ms
KEY = "pg-inference-key"
REPLY = "Hello from the playground stub, streamed word by word."


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    folder = tmp_path_factory.mktemp("playground")
    sglang = folder / "sglang"
    sglang.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(FAKES)!r})\n"
                      "from fake_sglang import parse\nfrom openai_fake import run\nsys.exit(run('sglang', parse))\n")
    sglang.chmod(0o755)
    models = {
        "pg-echo": {"backend": "stub", "stub_reply": REPLY, "stub_token_delay_ms": 20,
                    "sampling_options": ["seed", "presence_penalty"]},
        "pg-cold": {"backend": "stub", "stub_reply": "Loaded on request.", "stub_load_seconds": 0.5,
                    "load_on_request": True},
        "pg-off": {"backend": "stub"},
        "pg-server": {"backend": "sglang_serve", "sglang_serve_model": TARGET, "sglang_serve_binary": str(sglang),
                      "sglang_serve_startup_timeout_seconds": 30.0},
    }
    keys = [{"name": "pg", "key_sha256": hash_key(KEY), "models": "*"}]
    settings_path = write_settings(folder, models, service={"admin_token": TOKEN, "api_keys": keys})
    live = LiveService(settings_path, folder / "db.sqlite3", env={"LLMPOOL_STATE_DIR": str(folder / "state")},
                       mode="embedded").start()
    try:
        live.staff = create_superuser(live)
        yield live
    finally:
        assert live.stop() == 0


@pytest.fixture
def open_model(browser, service):
    context = browser.new_context(viewport={"width": 1300, "height": 1400})
    errors: list[str] = []
    logged_in = []

    def open_page(name: str):
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{service.url}/admin/llm-pool/models/{name}/")
        if not logged_in:
            page.fill("#id_username", service.staff["username"])
            page.fill("#id_password", service.staff["password"])
            page.click("input[type=submit]")
            logged_in.append(True)
        expect(page.locator("h1")).to_contain_text(name)
        return page

    yield open_page
    context.close()
    assert not errors, errors


def admin(service) -> httpx.Client:
    return httpx.Client(base_url=service.url, timeout=30, headers=AUTH)


def test_the_playground_streams_the_answer_with_its_figures_behind_an_api_key(open_model, service):
    with admin(service) as http:
        assert http.post("/v1/admin/models/pg-echo/load").json()["runtime_state"] == "loaded"
        try:
            page = open_model("pg-echo")
            box = page.locator("[data-playground]")
            # The decoding fields are those its capabilities allow: seed and presence_penalty, not frequency_penalty.
            for name in ("max_tokens", "temperature", "top_p", "seed", "presence_penalty"):
                expect(box.locator(f"[name={name}]")).to_have_count(1)
            expect(box.locator("[name=frequency_penalty]")).to_have_count(0)
            expect(box.locator("[name=reasoning_effort]")).to_have_count(0)
            page.fill("#playground-system", "You are terse.")
            page.fill("#playground-prompt", "Say hello")
            page.click("[data-playground-send]")  # no key yet: asked for one, nothing sent
            expect(box.locator("[data-playground-status]")).to_contain_text("Enter an API key")
            page.fill("#playground-key", "wrong-key")
            page.click("[data-playground-send]")
            expect(box.locator("[data-playground-status]")).to_contain_text("401 invalid_api_key", timeout=LIVE)
            page.fill("#playground-key", KEY)
            box.locator("[name=seed]").fill("7")
            box.locator("[name=max_tokens]").fill("64")
            page.click("[data-playground-send]")
            answer = box.locator("[data-playground-answer]")
            expect(answer).to_contain_text("Hello from", timeout=LIVE)  # in place, before the end
            expect(box.locator("[data-playground-status]")).to_contain_text("Done (finish_reason stop)", timeout=LIVE)
            expect(answer).to_have_text(REPLY)
            figures = box.locator("[data-playground-figures]")
            words = len(REPLY.split())
            expect(figures).to_contain_text(f"+ {words} completion tokens")
            expect(figures).to_contain_text("5 prompt +")  # "You are terse." + "Say hello": the stub counts words
            text = figures.inner_text()
            assert "time to first token " in text and " ms · " in text and " tokens/s" in text, text
            rate = float(text.split(" · ")[1].split()[0])
            assert rate > 0, text
            assert int(box.get_attribute("data-ttft-ms")) >= 0
            # The request went through the client API: the activity ring has it under the key's bucket.
            [item] = http.get("/v1/admin/activity", params={"model": "pg-echo"}).json()["requests"][:1]
            assert (item["endpoint"], item["status"], item["output_tokens"]) == ("chat_completions", 200, words)
        finally:
            http.post("/v1/admin/models/pg-echo/unload")


def test_an_unloaded_model_says_so_and_a_load_on_request_one_loads(open_model, service):
    page = open_model("pg-off")
    page.fill("#playground-key", KEY)
    page.fill("#playground-prompt", "anyone there?")
    page.click("[data-playground-send]")
    status = page.locator("[data-playground-status]")
    expect(status).to_contain_text("pg-off is unloaded: load it first")
    expect(page.locator("[data-playground-answer]")).to_have_text("")
    with admin(service) as http:
        assert http.get("/v1/admin/activity", params={"model": "pg-off"}).json()["requests"] == []  # nothing sent
        cold = open_model("pg-cold")
        expect(cold.locator("[data-playground] .description")).to_contain_text("load_on_request")
        cold.fill("#playground-key", KEY)
        cold.fill("#playground-prompt", "wake up")
        cold.click("[data-playground-send]")
        try:
            expect(cold.locator("[data-playground-status]")).to_contain_text("Done", timeout=LIVE)
            expect(cold.locator("[data-playground-answer]")).to_have_text("Loaded on request.")
            entry = next(m for m in http.get("/v1/admin/models").json()["models"] if m["name"] == "pg-cold")
            assert (entry["runtime_state"], entry["last_reason"]) == ("loaded", "request")
        finally:
            http.post("/v1/admin/models/pg-cold/unload")


def test_the_log_pane_shows_the_servers_output_and_its_new_lines(open_model, service):
    with admin(service) as http:
        assert http.post("/v1/admin/models/pg-server/load").json()["runtime_state"] == "loaded"
        try:
            tail = http.get("/v1/admin/models/pg-server/logs").json()["replicas"][0]["lines"]
            assert tail, "the fake server printed nothing"
            page = open_model("pg-server")
            pane = page.locator("[data-log-pane]")
            expect(pane.locator("[data-log-status]")).to_have_text("live", timeout=LIVE)
            lines = pane.locator(".log-line")
            expect(lines).to_have_count(len(tail), timeout=LIVE)
            expect(lines.first).to_have_text(f"[0] {tail[0]}")
            expect(lines.last).to_have_text(f"[0] {tail[-1]}")
            answered = httpx.post(service.url + "/v1/chat/completions", timeout=30, headers={
                "Authorization": f"Bearer {KEY}"}, json={"model": "pg-server", "messages": [
                    {"role": "user", "content": "secret words"}]})
            assert answered.status_code == 200, answered.text
            expect(lines.last).to_contain_text("HTTP ", timeout=LIVE)  # the access line, live
            assert "secret" not in pane.inner_text()
            missing = page.request.get(service.url + "/admin/llm-pool/models/nope/logs")  # the staff session
            assert (missing.status, missing.json()["error"]["code"]) == (404, "unknown_model")
        finally:
            http.post("/v1/admin/models/pg-server/unload")
    # Staff only: without the session the stream is the login redirect, not the log.
    anonymous = httpx.get(service.url + "/admin/llm-pool/models/pg-server/logs")
    assert anonymous.status_code == 302 and "/login/" in anonymous.headers["location"]
