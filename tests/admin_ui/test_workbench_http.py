"""The workbench without JavaScript: plain form posts (CSRF on), redirects with messages, staff only."""
from __future__ import annotations

import re

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from runtime.redaction import REDACTED
from tests.admin_ui.helpers import AUTH, WORKBENCH_SECRETS

CSRF_INPUT = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
PAGES = ["/admin/llm-pool/models/", "/admin/llm-pool/models/stub-list/", "/admin/llm-pool/gpu/",
         "/admin/llm-pool/settings/"]


@pytest.fixture(scope="module")
def service(embedded_workbench):
    return embedded_workbench


def csrf_of(page: httpx.Response) -> str:
    return CSRF_INPUT.search(page.text).group(1)


@pytest.fixture
def browser_session(service):
    """An httpx client logged in through the admin login form."""
    with httpx.Client(base_url=service.url, timeout=30) as client:
        login = client.get("/admin/login/")
        answer = client.post("/admin/login/", data={
            "username": service.staff["username"],
            "password": service.staff["password"],
            "csrfmiddlewaretoken": csrf_of(login),
            "next": "/admin/",
        })
        assert answer.status_code == 302, answer.text
        yield client


@pytest.mark.parametrize("path", PAGES)
def test_pages_redirect_anonymous_users_to_the_login(service, path):
    answer = httpx.get(service.url + path, timeout=15)
    assert answer.status_code == 302
    assert answer.headers["location"] == f"/admin/login/?next={path}"


def test_an_admin_token_is_no_way_into_the_pages(service):
    answer = httpx.get(service.url + PAGES[0], headers=AUTH, timeout=15)
    assert answer.status_code == 302


@pytest.mark.parametrize("path", PAGES)
def test_every_page_renders_for_staff(browser_session, path):
    answer = browser_session.get(path)
    assert answer.status_code == 200
    assert "llm-pool administration" in answer.text
    assert answer.headers["Cache-Control"].startswith("max-age=0")


def test_posts_need_the_csrf_token(browser_session):
    answer = browser_session.post("/admin/llm-pool/models/actions", data={"single": "load:stub-list"})
    assert answer.status_code == 403


def test_the_list_actions_work_as_plain_form_posts(browser_session):
    listing = browser_session.get("/admin/llm-pool/models/")
    answer = browser_session.post("/admin/llm-pool/models/actions", data={
        "csrfmiddlewaretoken": csrf_of(listing),
        "action": "load",
        "_selected_action": ["stub-list", "stub-broken"],
        "next": "/admin/llm-pool/models/?backend=stub",
    })
    assert answer.status_code == 302
    assert answer.headers["location"] == "/admin/llm-pool/models/?backend=stub"
    page = browser_session.get(answer.headers["location"])
    messages = page.text.lower()  # the admin capitalizes messages
    assert "stub-list is loaded" in messages
    assert "stub-broken: load failed" in messages and "weights are corrupt" in messages
    answer = browser_session.post("/admin/llm-pool/models/actions", data={
        "csrfmiddlewaretoken": csrf_of(page), "single": "unload:stub-list", "next": "https://elsewhere.example/"})
    assert answer.headers["location"] == "/admin/llm-pool/models/"  # no open redirect
    assert "stub-list is unloaded" in browser_session.get("/admin/llm-pool/models/").text.lower()


def test_the_load_form_without_javascript_shows_runtime_errors_on_the_page(browser_session):
    page = browser_session.get("/admin/llm-pool/models/gguf-missing/")
    answer = browser_session.post("/admin/llm-pool/models/gguf-missing/load", data={
        "csrfmiddlewaretoken": csrf_of(page), "gguf_n_ctx": "0", "gguf_type_k": "q8_0"})
    assert answer.status_code == 422
    assert "invalid_load_body" in answer.text
    assert 'value="q8_0"' in answer.text  # what was typed is still there


def test_the_json_answers_of_the_page_scripts(browser_session):
    page = browser_session.get("/admin/llm-pool/models/stub-list/")
    token = csrf_of(page)
    headers = {"Accept": "application/json"}
    loaded = browser_session.post("/admin/llm-pool/models/stub-list/load", headers=headers,
                                  data={"csrfmiddlewaretoken": token, "replicas": "1"})
    assert loaded.status_code == 200
    body = loaded.json()
    assert body["ok"] and body["entry"]["runtime_state"] == "loaded" and "data-load-submit" in body["form_html"]
    rejected = browser_session.post("/admin/llm-pool/models/stub-list/load", headers=headers,
                                    data={"csrfmiddlewaretoken": token, "replicas": "2"})
    assert rejected.status_code == 400
    assert not rejected.json()["ok"] and "invalid_load_request" in rejected.json()["form_html"]
    unloaded = browser_session.post("/admin/llm-pool/models/stub-list/unload", headers=headers,
                                    data={"csrfmiddlewaretoken": token})
    assert unloaded.json()["entry"]["runtime_state"] == "unloaded"


def test_an_unknown_model_is_404(browser_session):
    assert browser_session.get("/admin/llm-pool/models/no-such-model/").status_code == 404
    page = browser_session.get("/admin/llm-pool/models/")
    answer = browser_session.post("/admin/llm-pool/models/no-such-model/unload",
                                  data={"csrfmiddlewaretoken": csrf_of(page)})
    assert answer.status_code == 404


@pytest.mark.parametrize("path", ["/admin/llm-pool/models/", "/admin/llm-pool/models/remote-keyed/",
                                  "/admin/llm-pool/models/server-env/", "/admin/llm-pool/gpu/",
                                  "/admin/models_app/catalogmodel/"])
def test_no_page_shows_a_secret(browser_session, path):
    page = browser_session.get(path).text
    assert not any(secret in page for secret in WORKBENCH_SECRETS)


def test_the_mirror_rows_page_in_the_django_admin_shows_no_secret(browser_session):
    listing = browser_session.get("/admin/models_app/catalogmodel/?q=remote-keyed").text
    [row] = set(re.findall(r"/admin/models_app/catalogmodel/(\d+)/change/", listing))
    page = browser_session.get(f"/admin/models_app/catalogmodel/{row}/change/").text
    assert "remote_api_key" in page and REDACTED in page
    assert not any(secret in page for secret in WORKBENCH_SECRETS)


def test_the_model_page_shows_secrets_redacted(browser_session):
    page = browser_session.get("/admin/llm-pool/models/server-env/").text
    assert REDACTED in page and "HF_TOKEN" in page


# ---- the live feed's WebSocket over the real server -----------------------------------------------------


def websocket_url(service) -> str:
    return service.url.replace("http://", "ws://") + "/admin/llm-pool/ws"


def session_header(browser_session) -> dict:
    return {"Cookie": f"sessionid={browser_session.cookies['sessionid']}"}


def test_the_websocket_opens_from_the_service_own_pages(service, browser_session):
    with connect(websocket_url(service), origin=service.url, additional_headers=session_header(browser_session),
                 open_timeout=15) as websocket:
        snapshot = websocket.recv(timeout=15)
    assert '"kind": "snapshot"' in snapshot and REDACTED in snapshot
    assert not any(secret in snapshot for secret in WORKBENCH_SECRETS)


@pytest.mark.parametrize("origin", ["https://evil.example", "null"])
def test_a_page_of_another_origin_gets_403_with_the_operators_cookie(service, browser_session, origin):
    with pytest.raises(InvalidStatus) as refused:
        connect(websocket_url(service), origin=origin, additional_headers=session_header(browser_session),
                open_timeout=15)
    assert refused.value.response.status_code == 403


def test_no_inference_key_secret_reaches_the_websocket_snapshot(service, browser_session):
    made = httpx.post(service.url + "/v1/admin/keys", json={"name": "ws-watch"}, headers=AUTH, timeout=15).json()
    try:
        with connect(websocket_url(service), origin=service.url, additional_headers=session_header(browser_session),
                     open_timeout=15) as websocket:
            snapshot = websocket.recv(timeout=15)
        assert '"kind": "snapshot"' in snapshot
        assert made["key"] not in snapshot and made["key"].removeprefix("sk-llmpool-") not in snapshot
    finally:
        httpx.delete(service.url + f"/v1/admin/keys/{made['id']}", headers=AUTH, timeout=15)


def test_the_playground_asks_for_a_key_once_one_is_made_through_the_keys_api(service, browser_session):
    page = "/admin/llm-pool/models/stub-list/"
    assert 'id="playground-key"' not in browser_session.get(page).text
    made = httpx.post(service.url + "/v1/admin/keys", json={"name": "playground"}, headers=AUTH, timeout=15).json()
    try:
        assert 'id="playground-key"' in browser_session.get(page).text
    finally:
        httpx.delete(service.url + f"/v1/admin/keys/{made['id']}", headers=AUTH, timeout=15)
    assert 'id="playground-key"' not in browser_session.get(page).text
