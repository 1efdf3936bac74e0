"""The keys API (/v1/admin/keys) against a live service, on both shapes: a key created, used
(Bearer and x-api-key), disabled, enabled and deleted takes effect on every API process within a
second, with no restart (the split runs two API processes); ``manage.py create_api_key`` stores a
key the running service takes up; hostile bodies are refused with nothing changed; the keys of
settings.json are listed read-only; no answer but the creation's, and no log, shows a secret;
an inference key never opens the admin API."""
from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import ROOT, LiveService, _terminate, api_command, free_port, write_settings

ADMIN_TOKEN = "keys-admin-secret"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
OPS_KEY = secrets.token_urlsafe(32)  # a key of settings.json
PROPAGATION_SECONDS = 1.0
ECHO = {"model": "echo", "input": "ping"}


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    """The service, and with the split a second API process on the same Redis and database."""
    folder = tmp_path_factory.mktemp("keys_api")
    ops = {"name": "ops", "key_sha256": hashlib.sha256(OPS_KEY.encode()).hexdigest(), "models": "*"}
    settings = write_settings(folder, {"echo": {"backend": "stub"}},
                              service={"admin_token": ADMIN_TOKEN, "api_keys": [ops]})
    live = LiveService(settings, folder / "db.sqlite3").start()
    live.urls = [live.url]
    second = None
    try:
        if live.mode == "split":
            port = free_port()
            second = live._spawn(*api_command(port))
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda: healthy(url), 30)
            live.urls.append(url)
        with httpx.Client(base_url=live.url, headers=AUTH, timeout=30) as admin:
            assert admin.post("/v1/admin/models/echo/load").json()["runtime_state"] == "loaded"
        yield live
    finally:
        _terminate(second)
        live.stop()


@pytest.fixture
def admin(service):
    with httpx.Client(base_url=service.url, headers=AUTH, timeout=30) as client:
        yield client


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.02)


def status(url: str, headers: dict) -> int:
    return httpx.post(url + "/v1/responses", json=ECHO, headers=headers, timeout=30).status_code


def everywhere(service, headers: dict, expected: int) -> None:
    """Every API process answers ``expected`` within PROPAGATION_SECONDS of now; the one that made
    the change (the first) at once."""
    assert status(service.urls[0], headers) == expected
    started = time.monotonic()
    for url in service.urls[1:]:
        wait_for(lambda url=url: status(url, headers) == expected, PROPAGATION_SECONDS - (time.monotonic() - started))


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def create(admin, **fields) -> dict:
    answer = admin.post("/v1/admin/keys", json=fields)
    assert answer.status_code == 201, answer.text
    return answer.json()


def listing(admin) -> list[dict]:
    answer = admin.get("/v1/admin/keys")
    assert answer.status_code == 200
    return answer.json()["keys"]


def test_a_key_is_created_used_disabled_enabled_and_deleted_live(service, admin):
    made = create(admin, name="live", models=["echo"])
    key = made["key"]
    assert key.startswith("sk-llmpool-") and len(key) == len("sk-llmpool-") + 43
    assert made["id"].startswith("key_") and made["source"] == "api" and made["disabled"] is False
    everywhere(service, bearer(key), 200)
    everywhere(service, {"x-api-key": key}, 200)
    assert httpx.get(service.url + "/v1/models", headers=bearer(key)).json()["data"][0]["id"] == "echo"

    assert admin.patch(f"/v1/admin/keys/{made['id']}", json={"disabled": True}).json()["disabled"] is True
    everywhere(service, bearer(key), 401)
    everywhere(service, {"x-api-key": key}, 401)
    refused = httpx.post(service.url + "/v1/responses", json=ECHO, headers=bearer(key))
    assert refused.json()["error"]["code"] == "invalid_api_key"

    assert admin.patch(f"/v1/admin/keys/{made['id']}", json={"disabled": False}).json()["disabled"] is False
    everywhere(service, bearer(key), 200)

    assert admin.delete(f"/v1/admin/keys/{made['id']}").status_code == 204
    everywhere(service, bearer(key), 401)
    gone = admin.get(f"/v1/admin/keys/{made['id']}")
    assert (gone.status_code, gone.json()["error"]["code"]) == (404, "unknown_api_key")
    assert admin.delete(f"/v1/admin/keys/{made['id']}").status_code == 404


def test_a_change_of_models_takes_effect_live(service, admin):
    made = create(admin, name="narrow", models=["other"])
    answer = httpx.post(service.url + "/v1/responses", json=ECHO, headers=bearer(made["key"]))
    assert (answer.status_code, answer.json()["error"]["code"]) == (403, "model_not_allowed")
    assert admin.patch(f"/v1/admin/keys/{made['id']}", json={"models": "*"}).status_code == 200
    everywhere(service, bearer(made["key"]), 200)
    admin.delete(f"/v1/admin/keys/{made['id']}")


def test_the_fields_are_stored_and_shown_never_the_secret(service, admin):
    fields = {"name": "limited", "models": ["echo"], "requests_per_minute": 60, "tokens_per_minute": 10_000,
              "max_concurrent": 2, "token_budget": 1_000_000, "budget_period": "day", "priority": "batch",
              "fairness_key": "team-x", "weight": 2.5, "queue_timeout_seconds": 1.5}
    made = create(admin, **fields)
    shown = admin.get(f"/v1/admin/keys/{made['id']}").json()
    assert {name: shown[name] for name in fields} == fields
    assert shown == {name: value for name, value in made.items() if name != "key"}
    digest = hashlib.sha256(made["key"].encode()).hexdigest()
    for text in (admin.get("/v1/admin/keys").text, admin.get(f"/v1/admin/keys/{made['id']}").text,
                 admin.patch(f"/v1/admin/keys/{made['id']}", json={"weight": 1.0}).text):
        assert made["key"] not in text and digest not in text and "key_sha256" not in text
    assert httpx.post(service.url + "/v1/responses", json=ECHO, headers=bearer(made["key"])).status_code == 200
    assert made["key"] not in service.log()
    # The bucket the key's requests take is its fairness_key.
    answer = httpx.post(service.url + "/v1/responses", json={**ECHO, "user": "mallory"}, headers=bearer(made["key"]))
    assert answer.json()["user"] == "team-x"
    admin.delete(f"/v1/admin/keys/{made['id']}")


# Limits an operator's typo could make: none may be stored (one would refuse every request, or none).
LIMIT_HOSTILE = [
    {"name": "h", "max_concurrent": 0},
    {"name": "h", "token_budget": 0, "budget_period": "month"},
    {"name": "h", "token_budget": -1, "budget_period": "day"},
    {"name": "h", "tokens_per_minute": 10**11},
    {"name": "h", "token_budget": 10**16, "budget_period": "day"},
    {"name": "h", "requests_per_minute": 10**400},
    {"name": "h", "requests_per_minute": "60"},
    {"name": "h", "max_concurrent": [1]},
    {"name": "h", "tokens_per_minute": {"per": 1}},
    {"name": "h", "requests_per_minute": 1e3},
    {"name": "h", "queue_timeout_seconds": 0},
    {"name": "h", "queue_timeout_seconds": -1},
    {"name": "h", "queue_timeout_seconds": 86_401},
    {"name": "h", "queue_timeout_seconds": "5"},
    {"name": "h", "queue_timeout_seconds": True},
    {"name": "h", "weight": 1001},
]

HOSTILE = [
    {"name": "h", "requests_per_minute": 0},
    {"name": "h", "tokens_per_minute": -5},
    {"name": "h", "max_concurrent": 10**30},
    {"name": "h", "token_budget": "1000", "budget_period": "day"},
    {"name": "h", "requests_per_minute": True},
    {"name": "h", "requests_per_minute": 1.5},
    {"name": "h", "weight": 0},
    {"name": "h", "weight": 1e308},
    {"name": "h", "token_budget": 1000},
    {"name": "h", "budget_period": "week", "token_budget": 1000},
    {"name": "h", "priority": "urgent"},
    {"name": "h", "models": []},
    {"name": "h", "models": "echo"},
    {"name": "h", "unknown": 1},
    {"name": "bad name"},
    {"name": ""},
    {"models": "*"},
    {"name": "h", "disabled": "yes"},
    [],
    None,
    "name",
    *LIMIT_HOSTILE,
]


@pytest.mark.parametrize("body", HOSTILE)
def test_a_hostile_create_is_refused_and_stores_nothing(admin, body):
    before = listing(admin)
    answer = admin.post("/v1/admin/keys", content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "invalid_request" and answer.json()["error"]["message"]
    assert listing(admin) == before


PATCH_HOSTILE = [
    *({name: value for name, value in body.items() if name != "name"} for body in HOSTILE[:14]),
    {"name": "bad name"}, {"name": None}, {"models": None}, {"disabled": None}, {"priority": None},
    {"id": "key_1"}, {"key": "sk-llmpool-mine"}, [], None, "name",
    *({name: value for name, value in body.items() if name != "name"} for body in LIMIT_HOSTILE),
]


@pytest.mark.parametrize("body", PATCH_HOSTILE)
def test_a_hostile_change_is_refused_and_changes_nothing(admin, body):
    made = create(admin, name="target")
    try:
        before = admin.get(f"/v1/admin/keys/{made['id']}").json()
        answer = admin.patch(f"/v1/admin/keys/{made['id']}", content=json.dumps(body),
                             headers={"Content-Type": "application/json"})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "invalid_request"
        assert admin.get(f"/v1/admin/keys/{made['id']}").json() == before
    finally:
        admin.delete(f"/v1/admin/keys/{made['id']}")


def test_a_body_that_is_not_json_is_refused(admin):
    answer = admin.post("/v1/admin/keys", content=b'{"name": "x", "weight": NaN}',
                        headers={"Content-Type": "application/json"})
    assert (answer.status_code, answer.json()["error"]["code"]) == (400, "invalid_request")


def test_names_are_unique_across_the_database_and_settings(admin):
    made = create(admin, name="taken")
    other = create(admin, name="other")
    try:
        for answer in (admin.post("/v1/admin/keys", json={"name": "taken"}),
                       admin.post("/v1/admin/keys", json={"name": "ops"}),
                       admin.patch(f"/v1/admin/keys/{other['id']}", json={"name": "taken"}),
                       admin.patch(f"/v1/admin/keys/{other['id']}", json={"name": "ops"})):
            assert (answer.status_code, answer.json()["error"]["code"]) == (409, "api_key_name_taken"), answer.text
        assert admin.get(f"/v1/admin/keys/{other['id']}").json()["name"] == "other"
    finally:
        admin.delete(f"/v1/admin/keys/{made['id']}")
        admin.delete(f"/v1/admin/keys/{other['id']}")


def test_settings_keys_are_listed_read_only_and_keep_working(service, admin):
    ops = next(key for key in listing(admin) if key["name"] == "ops")
    assert ops["id"] == "settings:ops" and ops["source"] == "settings" and ops["disabled"] is False
    assert admin.get("/v1/admin/keys/settings:ops").json() == ops
    for answer in (admin.patch("/v1/admin/keys/settings:ops", json={"disabled": True}),
                   admin.delete("/v1/admin/keys/settings:ops")):
        assert (answer.status_code, answer.json()["error"]["code"]) == (409, "api_key_read_only")
    for unknown in ("settings:nobody", "key_999999", "key_x", "nothing"):
        answer = admin.get(f"/v1/admin/keys/{unknown}")
        assert (answer.status_code, answer.json()["error"]["code"]) == (404, "unknown_api_key")
    assert status(service.url, bearer(OPS_KEY)) == 200
    assert OPS_KEY not in admin.get("/v1/admin/keys").text


def test_the_keys_api_needs_the_admin_token_and_no_inference_key_opens_it(service, admin):
    made = create(admin, name="not-admin")
    try:
        for headers in ({}, bearer(made["key"]), bearer(OPS_KEY), {"x-api-key": ADMIN_TOKEN}):
            for method, path in (("GET", "/v1/admin/keys"), ("POST", "/v1/admin/keys"),
                                 ("GET", "/v1/admin/models"), ("DELETE", f"/v1/admin/keys/{made['id']}")):
                answer = httpx.request(method, service.url + path, headers=headers, json={"name": "intruder"})
                assert (answer.status_code, answer.json()["error"]["code"]) == (401, "unauthorized")
        assert [key["name"] for key in listing(admin)].count("intruder") == 0
    finally:
        admin.delete(f"/v1/admin/keys/{made['id']}")


def test_create_api_key_stores_a_key_the_running_service_takes_up(service, admin):
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "create_api_key", "--name", "from-cli", "--models", "echo"],
        cwd=ROOT, env=service.env, capture_output=True, text=True, timeout=60, check=True,
    )
    first, second = done.stdout.splitlines()
    key = first.rsplit(" ", 1)[1]
    shown = json.loads(second)
    assert key.startswith("sk-llmpool-") and key not in second
    assert (shown["name"], shown["models"], shown["source"]) == ("from-cli", ["echo"], "api")
    started = time.monotonic()
    for url in service.urls:
        wait_for(lambda url=url: status(url, bearer(key)) == 200, PROPAGATION_SECONDS - (time.monotonic() - started))
    again = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "create_api_key", "--name", "from-cli"],
        cwd=ROOT, env=service.env, capture_output=True, text=True, timeout=60,
    )
    assert again.returncode != 0 and "api_key_name_taken" in again.stderr
    admin.delete(f"/v1/admin/keys/{shown['id']}")


def test_without_an_admin_token_the_keys_api_is_refused(live_service):
    open_service = live_service({"echo": {"backend": "stub"}})
    with open_service.client() as client:
        for method, path in (("GET", "/v1/admin/keys"), ("POST", "/v1/admin/keys"), ("PATCH", "/v1/admin/keys/key_1"),
                             ("DELETE", "/v1/admin/keys/key_1")):
            answer = client.request(method, path, json={"name": "mine"})
            assert (answer.status_code, answer.json()["error"]["code"]) == (403, "admin_token_required")
        assert client.get("/v1/admin/models").status_code == 200  # the rest of the admin API is as it was
        assert client.post("/v1/responses", json={"model": "echo", "input": "x"}).json()["error"]["code"] \
            == "model_not_loaded"  # no key was made: the service stays open


def test_the_openapi_schema_documents_the_keys_api(service):
    paths = httpx.get(service.url + "/v1/openapi.json", timeout=15).json()["paths"]
    assert {"get", "post"} <= set(paths["/v1/admin/keys"])
    assert {"get", "patch", "delete"} <= set(paths["/v1/admin/keys/{key_id}"])
    create = paths["/v1/admin/keys"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    change = paths["/v1/admin/keys/{key_id}"]["patch"]["requestBody"]["content"]["application/json"]["schema"]
    assert create["required"] == ["name"] and "required" not in change
    rpm = create["properties"]["requests_per_minute"]
    assert (rpm["type"], rpm["minimum"], rpm["maximum"], rpm["nullable"]) == ("integer", 1, 1_000_000, True)
    assert paths["/v1/admin/keys"]["post"]["requestBody"]["required"] is True
    assert create["properties"]["weight"]["exclusiveMinimum"] is True
