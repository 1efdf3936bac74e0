"""Inference keys (service.api_keys) against a live service: 401 without a valid key on every
inference endpoint, 403 for a model the key may not use, a model and its aliases granted alike
whichever of its names the key lists, the models list filtered, the fairness bucket chosen by the
key whatever ``user`` and the fairness header say, the official client, the admin token's rule
unchanged; service.fairness_key_headers without keys; create_api_key."""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys

import openai
import pytest

from tests.conftest import ROOT, LiveService, free_port, model_entry, wait_until, write_settings

SLOW_REPLY = " ".join(f"w{i}" for i in range(60))  # 60 tokens x 100 ms: far longer than any wait below
MODELS = {
    "echo": {"backend": "stub"},
    "fixed": {"backend": "stub", "stub_reply": "alpha beta"},
    "slow": {"backend": "stub", "stub_reply": SLOW_REPLY, "stub_token_delay_ms": 100},
    "qwen": {"backend": "stub", "stub_reply": "from qwen", "aliases": ["gpt-4o-mini", "qwen-latest"]},
}
ADMIN_TOKEN = "admin-secret"
BOB_KEY = secrets.token_urlsafe(32)
MODEL_KEY = secrets.token_urlsafe(32)  # lists the model "qwen"
ALIAS_KEY = secrets.token_urlsafe(32)  # lists qwen's alias "gpt-4o-mini"
REALM = 'Bearer realm="llm-pool"'
ENDPOINTS = [
    ("POST", "/v1/responses", {"model": "echo", "input": "x"}),
    ("POST", "/v1/responses", {"model": "echo", "input": "x", "stream": True}),
    ("POST", "/v1/chat/completions", {"model": "echo", "messages": [{"role": "user", "content": "x"}]}),
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/echo", None),
    ("POST", "/v1/messages", {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}),
]


def create_api_key(name: str, *args: str) -> tuple[str, dict]:
    """Run ``manage.py create_api_key --settings-entry``: (the key it printed, the settings entry it printed)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "create_api_key", "--name", name, "--settings-entry", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout
    return lines[0].rsplit(" ", 1)[1], json.loads(lines[2])


@pytest.fixture(scope="module")
def alice():
    """alice may use echo and slow; her key and entry come from the command."""
    return create_api_key("alice", "--models", "echo,slow")


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape, alice):
    folder = tmp_path_factory.mktemp("api_keys")
    bob = {
        "name": "bob", "key_sha256": hashlib.sha256(BOB_KEY.encode()).hexdigest(), "models": "*",
        "fairness_key": "team-b", "weight": 3,
    }
    by_model = {"name": "by-model", "key_sha256": hashlib.sha256(MODEL_KEY.encode()).hexdigest(), "models": ["qwen"]}
    by_alias = {"name": "by-alias", "key_sha256": hashlib.sha256(ALIAS_KEY.encode()).hexdigest(),
                "models": ["gpt-4o-mini"]}
    keys = [alice[1], bob, by_model, by_alias]
    settings = write_settings(folder, MODELS, service={"admin_token": ADMIN_TOKEN, "api_keys": keys})
    live = LiveService(settings, folder / "db.sqlite3").start()
    try:
        with admin_client(live) as http:
            for name in MODELS:
                assert http.post(f"/v1/admin/models/{name}/load").json()["runtime_state"] == "loaded"
        yield live
    finally:
        live.stop()


def admin_client(live: LiveService):
    return live.client(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})


@pytest.fixture
def admin(service):
    with admin_client(service) as http:
        yield http


@pytest.fixture
def as_alice(service, alice):
    with service.client(headers={"Authorization": f"Bearer {alice[0]}"}) as http:
        yield http


@pytest.fixture
def as_bob(service):
    with service.client(headers={"Authorization": f"Bearer {BOB_KEY}"}) as http:
        yield http


def bucket(admin, model: str, key: str) -> dict | None:
    return next((k for k in model_entry(admin, model)["fairness"]["keys"] if k["key"] == key), None)


# ---- 401 ----------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
@pytest.mark.parametrize("authorization", [
    None, "Bearer not-a-key", "Bearer", f"Basic {BOB_KEY}", BOB_KEY, f"Bearer {ADMIN_TOKEN}", f"Bearer {BOB_KEY}x",
], ids=["none", "unknown-key", "bare-bearer", "basic-scheme", "no-scheme", "admin-token", "key-plus-a-letter"])
def test_every_inference_endpoint_needs_a_valid_key(http, method, path, body, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    answer = http.request(method, path, json=body, headers=headers)
    assert answer.status_code == 401
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["www-authenticate"] == REALM
    error = answer.json()["error"]
    assert error["code"] == "invalid_api_key"
    assert error["param"] is None and error["message"]


def test_the_scheme_is_case_insensitive(service):
    with service.client(headers={"Authorization": f"bearer {BOB_KEY}"}) as http:
        assert http.post("/v1/responses", json={"model": "echo", "input": "hi"}).status_code == 200


def test_the_admin_token_rule_is_unchanged(http, as_bob, admin):
    assert http.get("/healthz").status_code == 200
    refused = as_bob.get("/v1/admin/models")  # an inference key is no admin token
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized"
    assert refused.headers["www-authenticate"] == 'Bearer realm="llm-pool admin"'
    assert admin.get("/v1/admin/models").status_code == 200


# ---- which models --------------------------------------------------------------------


def test_a_key_may_use_only_its_models(as_alice, as_bob):
    chat = {"messages": [{"role": "user", "content": "x"}]}
    for path, body in (
        ("/v1/responses", {"input": "x"}),
        ("/v1/responses", {"input": "x", "stream": True}),
        ("/v1/chat/completions", chat),
        ("/v1/chat/completions", {**chat, "stream": True}),
    ):
        refused = as_alice.post(path, json={"model": "fixed", **body})
        assert refused.status_code == 403, path
        assert refused.json() == {"error": {
            "code": "model_not_allowed", "message": "this API key may not use the model 'fixed'", "param": "model",
        }}
        assert as_bob.post(path, json={"model": "fixed", **body}).status_code == 200
        assert as_alice.post(path, json={"model": "echo", **body}).status_code == 200
    # Refused before the model is looked up: a key learns nothing of the models it may not use.
    assert as_alice.post("/v1/responses", json={"model": "nope", "input": "x"}).json()["error"]["code"] == (
        "model_not_allowed"
    )
    assert as_bob.post("/v1/responses", json={"model": "nope", "input": "x"}).status_code == 404


@pytest.mark.parametrize("key", [MODEL_KEY, ALIAS_KEY], ids=["lists-the-model", "lists-an-alias"])
def test_a_key_may_use_its_model_by_every_name_and_the_answer_keeps_the_name_asked(service, key):
    """Listing a model grants its aliases, listing an alias grants the model and its other aliases:
    the key check compares the models both names mean."""
    chat = {"messages": [{"role": "user", "content": "x"}]}
    with service.client(headers={"Authorization": f"Bearer {key}"}) as http:
        for name in ("qwen", "gpt-4o-mini", "qwen-latest"):
            answer = http.post("/v1/responses", json={"model": name, "input": "x"})
            assert answer.status_code == 200, (name, answer.text)
            assert (answer.json()["model"], answer.json()["output"][0]["content"][0]["text"]) == (name, "from qwen")
            chat_answer = http.post("/v1/chat/completions", json={"model": name, **chat})
            assert chat_answer.status_code == 200, (name, chat_answer.text)
            assert chat_answer.json()["model"] == name
            with http.stream("POST", "/v1/chat/completions", json={"model": name, "stream": True, **chat}) as stream:
                assert stream.status_code == 200
                chunks = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: {")]
            assert chunks and {c["model"] for c in chunks} == {name}
            one = http.get(f"/v1/models/{name}")
            assert one.status_code == 200 and one.json()["id"] == name
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["qwen", "gpt-4o-mini", "qwen-latest"]
        for name in ("echo", "nope"):  # any other model, configured or not, as before
            refused = http.post("/v1/responses", json={"model": name, "input": "x"})
            assert refused.status_code == 403
            assert refused.json() == {"error": {
                "code": "model_not_allowed", "message": f"this API key may not use the model {name!r}", "param": "model",
            }}


def test_an_alias_added_by_a_reload_is_granted_at_once(service, admin):
    """The key check resolves by the catalog the runtime serves, reloaded, not by the one it started with."""
    original = service.settings_path.read_text()
    settings = json.loads(original)
    settings["models"]["qwen"]["aliases"].append("qwen-next")
    try:
        service.settings_path.write_text(json.dumps(settings))
        assert admin.post("/v1/admin/settings/reload").json()["updated_models"] == ["qwen"]
        with service.client(headers={"Authorization": f"Bearer {MODEL_KEY}"}) as http:
            answer = http.post("/v1/responses", json={"model": "qwen-next", "input": "x"})
            assert (answer.status_code, answer.json()["model"]) == (200, "qwen-next")
    finally:
        service.settings_path.write_text(original)
        assert admin.post("/v1/admin/settings/reload").status_code == 200


def test_a_key_that_lists_none_of_a_models_names_is_refused_every_one(as_alice):
    for name in ("qwen", "gpt-4o-mini", "qwen-latest"):
        refused = as_alice.post("/v1/chat/completions", json={"model": name, "messages": [{"role": "user", "content": "x"}]})
        assert refused.status_code == 403
        assert refused.json() == {"error": {
            "code": "model_not_allowed", "message": f"this API key may not use the model {name!r}", "param": "model",
        }}
        assert as_alice.get(f"/v1/models/{name}").status_code == 403
        messages = as_alice.post("/v1/messages", json={"model": name, "max_tokens": 8,
                                                       "messages": [{"role": "user", "content": "x"}]})
        assert messages.status_code == 403 and messages.json()["error"]["type"] == "permission_error"
        assert messages.json()["error"]["code"] == "model_not_allowed"


def test_the_models_list_holds_only_the_keys_models(as_alice, as_bob):
    assert [m["id"] for m in as_alice.get("/v1/models").json()["data"]] == ["echo", "slow"]
    assert [m["id"] for m in as_bob.get("/v1/models").json()["data"]] == [*MODELS, "gpt-4o-mini", "qwen-latest"]
    assert as_alice.get("/v1/models/echo").json()["id"] == "echo"
    refused = as_alice.get("/v1/models/fixed")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "model_not_allowed"
    assert as_bob.get("/v1/models/fixed").status_code == 200


# ---- the fairness bucket -------------------------------------------------------------


def test_the_bucket_is_the_keys_name_whatever_user_and_header_say(as_alice, admin):
    body = {"model": "slow", "input": "x", "stream": True, "user": "mallory"}
    with as_alice.stream("POST", "/v1/responses", json=body, headers={"X-LLMPool-Fairness-Key": "eve"}) as stream:
        assert stream.status_code == 200
        key = wait_until(lambda: (k := bucket(admin, "slow", "alice")) and k["active"] == 1 and k)
        assert key and (key["active"], key["pending"], key["weight"]) == (1, 0, 1.0)
        assert bucket(admin, "slow", "mallory") is None
        assert bucket(admin, "slow", "eve") is None
    answer = as_alice.post("/v1/responses", json={"model": "echo", "input": "x", "user": "mallory"})
    assert answer.json()["user"] == "alice"


def test_the_bucket_is_the_keys_fairness_key_with_its_weight(as_bob, admin):
    chat = {"model": "fixed", "messages": [{"role": "user", "content": "x"}], "user": "mallory"}
    assert as_bob.post("/v1/chat/completions", json=chat, headers={"X-LLMPool-Fairness-Key": "eve"}).status_code == 200
    keys = {k["key"]: k for k in model_entry(admin, "fixed")["fairness"]["keys"]}
    assert set(keys) == {"team-b"}
    assert keys["team-b"]["weight"] == 3.0


# ---- the official client -------------------------------------------------------------


def test_the_openai_client_with_its_api_key(service, alice):
    with openai.OpenAI(base_url=service.url + "/v1", api_key=alice[0], max_retries=0) as client:
        assert [model.id for model in client.models.list()] == ["echo", "slow"]
        assert client.responses.create(model="echo", input="ping pong").output_text == "ping pong"
        chat = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi there"}])
        assert chat.choices[0].message.content == "hi there"
        with pytest.raises(openai.PermissionDeniedError) as refused:
            client.chat.completions.create(model="fixed", messages=[{"role": "user", "content": "x"}])
        assert refused.value.code == "model_not_allowed"
    with openai.OpenAI(base_url=service.url + "/v1", api_key="wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as refused:
            client.responses.create(model="echo", input="x")
        assert refused.value.code == "invalid_api_key"


# ---- without keys: the fairness headers ----------------------------------------------


@pytest.fixture(scope="module")
def open_service(tmp_path_factory, api_shape):
    folder = tmp_path_factory.mktemp("fairness_headers")
    service = {"fairness_key_headers": ["X-OpenWebUI-User-Id", "X-LLMPool-Fairness-Key"]}
    live = LiveService(write_settings(folder, {"echo": {"backend": "stub"}}, service=service), folder / "db.sqlite3")
    live.start()
    try:
        with live.client() as http:
            assert http.post("/v1/admin/models/echo/load").status_code == 200
        yield live
    finally:
        live.stop()


@pytest.mark.parametrize(("headers", "user"), [
    ({"X-OpenWebUI-User-Id": "u-1", "X-LLMPool-Fairness-Key": "other"}, "u-1"),
    ({"X-LLMPool-Fairness-Key": "other"}, "other"),
    ({}, "from-body"),
])
def test_without_keys_the_first_fairness_header_present_wins(open_service, headers, user):
    with open_service.client() as http:
        body = {"model": "echo", "input": "x", "user": "from-body"}
        answer = http.post("/v1/responses", json=body, headers=headers)
        assert answer.status_code == 200
        assert answer.json()["user"] == user
        assert http.get("/v1/models").status_code == 200


# ---- settings and the command --------------------------------------------------------


def test_an_invalid_key_entry_stops_serve(tmp_path):
    entry = {"name": "x", "key_sha256": "ABC", "models": "*"}
    settings = write_settings(tmp_path, {}, service={"api_keys": [entry]})
    env = {**os.environ, "LLMPOOL_SETTINGS": str(settings), "LLMPOOL_DB_PATH": str(tmp_path / "db.sqlite3")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(free_port())],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert "invalid_settings" in done.stderr and "$.service.api_keys[0].key_sha256" in done.stderr


def test_create_api_key_prints_a_key_and_its_hash(alice):
    key, entry = alice
    assert key.startswith("sk-llmpool-") and len(key) >= 11 + 43
    assert entry == {
        "name": "alice", "key_sha256": hashlib.sha256(key.encode()).hexdigest(), "models": ["echo", "slow"],
    }
    other_key, every_model = create_api_key("carol")
    assert other_key != key and every_model["models"] == "*"
