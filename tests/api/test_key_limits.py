"""A key's limits enforced at the edge, against a live service on both shapes (the split runs two
API processes sharing one key's counters in Redis): the 61st request of a 60 rpm key is refused
on whichever process and protocol it comes, with the protocol's own envelope, Retry-After and the
x-ratelimit headers; tokens per minute are charged from the engine's real counts (whole answers
and streams); concurrent requests over max_concurrent are refused until one ends; a spent budget
stays spent across a restart of the embedded service; the usage per key is written to the database, read at
/v1/admin/keys/{id}/usage and exported in /metrics."""
from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from models_app.quotas.usage import FLUSH_SECONDS

# How long a test waits for usage rows: they are written in batches every FLUSH_SECONDS, after the
# runtime's answer to a cancel (at most its 2 s reply timeout). A patience, not a target: on a
# loaded CI machine the batch's write can take several periods; the wait ends as soon as they are there.
USAGE_PATIENCE = 30
from tests.api.test_keys_api import bearer, healthy, wait_for
from tests.conftest import ROOT, LiveService, _terminate, api_command, free_port, write_settings

ADMIN_TOKEN = "limits-admin-secret"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MODELS = {
    "echo": {"backend": "stub"},
    "vec": {"backend": "stub", "embeddings": True},
    "slow": {"backend": "stub", "stub_token_delay_ms": 150, "stub_reply": "one two three four five six"},
}
# A key of settings.json with limits of its own (read-only: the file is its source).
SETTINGS_SECRET = "sk-ops-from-the-settings-file"
SETTINGS_KEY = {"name": "ops", "key_sha256": hashlib.sha256(SETTINGS_SECRET.encode()).hexdigest(), "models": "*",
                "requests_per_minute": 3, "token_budget": 10**9, "budget_period": "month"}
PROPAGATION_SECONDS = 1.0
# An answer's tokens are charged just after it is sent (the split: one round trip to Redis then):
# a request that must see them waits this long after the answer.
CHARGED_SECONDS = 0.2

# One inference call per limited path: (path, body, the envelope's shape).
CALLS = [
    ("/v1/responses", {"model": "echo", "input": "ping"}, "openai"),
    ("/v1/chat/completions", {"model": "echo", "messages": [{"role": "user", "content": "ping"}]}, "openai"),
    ("/v1/completions", {"model": "echo", "prompt": "ping"}, "openai"),
    ("/v1/embeddings", {"model": "vec", "input": "ping"}, "openai"),
    ("/v1/messages", {"model": "echo", "max_tokens": 16, "messages": [{"role": "user", "content": "ping"}]},
     "anthropic"),
    ("/api/chat", {"model": "echo", "stream": False, "messages": [{"role": "user", "content": "ping"}]}, "ollama"),
    ("/api/generate", {"model": "echo", "stream": False, "prompt": "ping"}, "ollama"),
    ("/api/embed", {"model": "vec", "input": "ping"}, "ollama"),
]


def _start_api(service: LiveService, port: int):
    return service._spawn(*api_command(port))


def _load_models(url: str) -> None:
    with httpx.Client(base_url=url, headers=AUTH, timeout=30) as admin:
        for name in MODELS:
            assert admin.post(f"/v1/admin/models/{name}/load").json()["runtime_state"] == "loaded"


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    """The service, and with the split a second API process on the same Redis and database."""
    folder = tmp_path_factory.mktemp("key_limits")
    settings = write_settings(folder, MODELS, service={"admin_token": ADMIN_TOKEN, "api_keys": [SETTINGS_KEY]})
    live = LiveService(settings, folder / "db.sqlite3").start()
    live.urls = [live.url]
    live.second = None
    try:
        if live.mode == "split":
            port = free_port()
            live.second = _start_api(live, port)
            live.urls.append(f"http://127.0.0.1:{port}")
            wait_for(lambda: healthy(live.urls[1]), 30)
        _load_models(live.url)
        yield live
    finally:
        _terminate(live.second)
        live.stop()


@pytest.fixture
def admin(service):
    with httpx.Client(base_url=service.url, headers=AUTH, timeout=30) as client:
        yield client


def create(service, admin, **fields) -> dict:
    """A new key, once every API process knows it: it lets the key in and refuses one it does not
    know (before a process reads its first key, it lets anyone in).  GET /v1/models: no limit counts it."""
    answer = admin.post("/v1/admin/keys", json=fields)
    assert answer.status_code == 201, answer.text
    made = answer.json()

    def knows(url: str) -> bool:
        models = [httpx.get(url + "/v1/models", headers=bearer(key)).status_code for key in (made["key"], "sk-none")]
        return models == [200, 401]

    for url in service.urls:
        wait_for(lambda url=url: knows(url), PROPAGATION_SECONDS)
    return made


def change(service, admin, made: dict, **fields) -> None:
    """PATCH the key, then wait until every API process took the change (its ring is read every 0.5 s)."""
    assert admin.patch(f"/v1/admin/keys/{made['id']}", json=fields).status_code == 200
    time.sleep(PROPAGATION_SECONDS)


def call(url: str, key: str, path: str, body: dict, client: httpx.Client | None = None) -> httpx.Response:
    return (client or httpx).post(url + path, json=body, headers=bearer(key), timeout=30)


def code_of(answer: httpx.Response, shape: str) -> str:
    body = answer.json()
    if shape == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
        return body["error"]["code"]
    if shape == "ollama":
        assert isinstance(body["error"], str) and body["error"]
        return body["code"]
    return body["error"]["code"]


def usage_tokens(answer: httpx.Response) -> int:
    used = answer.json()["usage"]
    return used["input_tokens"] + used["output_tokens"]


def test_the_61st_request_of_a_60_rpm_key_is_refused_on_every_protocol_and_process(service, admin):
    made = create(service, admin, name="rpm", requests_per_minute=60)
    remaining, clients = [], [httpx.Client() for _ in service.urls]
    for index in range(60):
        path, body, _shape = CALLS[index % len(CALLS)]
        which = index % len(service.urls)
        answer = call(service.urls[which], made["key"], path, body, clients[which])
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-ratelimit-limit-requests"] == "60"
        assert "x-ratelimit-limit-tokens" not in answer.headers  # the key has no tokens per minute
        remaining.append(int(answer.headers["x-ratelimit-remaining-requests"]))
    assert remaining == list(range(59, -1, -1))  # one count, whichever process answered
    for index, (path, body, shape) in enumerate(CALLS):
        refused = call(service.urls[index % len(service.urls)], made["key"], path, body)
        assert refused.status_code == 429, refused.text
        assert code_of(refused, shape) == "rate_limited"
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert refused.headers["x-ratelimit-reset-requests"].endswith("s")
    for client in clients:
        client.close()
    # Counting a prompt's tokens runs no model: no limit applies to it.
    counted = call(service.url, made["key"], "/v1/messages/count_tokens",
                   {"model": "echo", "messages": [{"role": "user", "content": "ping"}]})
    assert counted.status_code == 200 and "x-ratelimit-limit-requests" not in counted.headers


def test_a_key_of_settings_json_has_its_limits_enforced_and_its_usage_kept(service, admin):
    shown = admin.get("/v1/admin/keys/settings:ops").json()
    assert (shown["source"], shown["requests_per_minute"], shown["token_budget"]) == ("settings", 3, 10**9)
    answers = [call(service.urls[index % len(service.urls)], SETTINGS_SECRET, "/v1/responses",
                    {"model": "echo", "input": "a b"}) for index in range(3)]
    assert [answer.headers["x-ratelimit-remaining-requests"] for answer in answers] == ["2", "1", "0"]
    refused = call(service.urls[-1], SETTINGS_SECRET, "/v1/chat/completions",
                   {"model": "echo", "messages": [{"role": "user", "content": "a"}]})
    assert (refused.status_code, refused.json()["error"]["code"]) == (429, "rate_limited")
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    spent = 3 * usage_tokens(answers[0])
    wait_for(lambda: admin.get("/v1/admin/keys/settings:ops/usage").json()["total"]["requests"] == 3, USAGE_PATIENCE)
    kept = admin.get("/v1/admin/keys/settings:ops/usage").json()
    assert (kept["id"], kept["name"], kept["budget"]["used"]) == ("settings:ops", "ops", spent)
    assert [day["model"] for day in kept["days"]] == ["echo"]


def test_the_headers_come_with_every_answer_of_a_limited_key_and_only_there(service, admin):
    made = create(service, admin, name="headers", requests_per_minute=1000, tokens_per_minute=100_000)
    unknown = call(service.url, made["key"], "/v1/responses", {"model": "nothing", "input": "x"})
    assert unknown.status_code == 404 and unknown.headers["x-ratelimit-remaining-requests"] == "999"
    assert unknown.headers["x-ratelimit-remaining-tokens"] == "100000"
    with httpx.stream("POST", service.url + "/v1/chat/completions", headers=bearer(made["key"]), timeout=30,
                      json={"model": "echo", "stream": True, "messages": [{"role": "user", "content": "a"}]}) as stream:
        assert stream.headers["x-ratelimit-remaining-requests"] == "998"
        stream.read()
    unlimited = create(service, admin, name="unlimited")
    answer = call(service.url, unlimited["key"], "/v1/responses", {"model": "echo", "input": "x"})
    assert answer.status_code == 200 and not any(name.startswith("x-ratelimit") for name in answer.headers)


def test_tokens_per_minute_are_charged_from_the_engines_real_counts(service, admin):
    made = create(service, admin, name="tpm", tokens_per_minute=1_000_000)
    first = call(service.urls[0], made["key"], "/v1/responses", {"model": "echo", "input": "one two three"})
    assert first.headers["x-ratelimit-remaining-tokens"] == "1000000"  # nothing answered before it
    spent = usage_tokens(first)
    time.sleep(CHARGED_SECONDS)
    streamed = httpx.post(service.urls[-1] + "/v1/chat/completions", headers=bearer(made["key"]), timeout=30, json={
        "model": "echo", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "four five six seven"}]})
    assert streamed.headers["x-ratelimit-remaining-tokens"] == str(1_000_000 - spent)
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    spent += chunks[-1]["usage"]["total_tokens"]
    time.sleep(CHARGED_SECONDS)
    probe = call(service.urls[0], made["key"], "/v1/responses", {"model": "nothing", "input": "x"})
    assert probe.headers["x-ratelimit-remaining-tokens"] == str(1_000_000 - spent)
    change(service, admin, made, tokens_per_minute=spent)
    for url in service.urls:
        refused = call(url, made["key"], "/v1/responses", {"model": "echo", "input": "x"})
        assert (refused.status_code, refused.json()["error"]["code"]) == (429, "token_rate_limited")
        assert 50 <= int(refused.headers["Retry-After"]) <= 60
    change(service, admin, made, tokens_per_minute=spent + 1)
    assert call(service.urls[-1], made["key"], "/v1/responses", {"model": "echo", "input": "x"}).status_code == 200


def test_a_stream_the_client_closes_early_is_charged_the_tokens_it_used(service, admin):
    """The client reads two deltas of six and goes away: the runtime stops the generation and says
    what it used, which the edge charges (usage rows, tokens per minute) as it does a whole answer."""
    made = create(service, admin, name="closer", tokens_per_minute=1_000_000)
    deltas = 0
    with httpx.stream("POST", service.urls[-1] + "/v1/chat/completions", headers=bearer(made["key"]), timeout=30,
                      json={"model": "slow", "stream": True, "messages": [{"role": "user", "content": "go"}]}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                deltas += 1
                if deltas == 2:
                    break
    wait_for(lambda: admin.get(f"/v1/admin/keys/{made['id']}/usage").json()["days"], USAGE_PATIENCE)
    [day] = admin.get(f"/v1/admin/keys/{made['id']}/usage").json()["days"]
    assert (day["model"], day["requests"]) == ("slow", 1)
    assert day["input_tokens"] > 0 and 2 <= day["output_tokens"] < 6  # cut short: fewer than six words
    spent = day["input_tokens"] + day["output_tokens"]
    for url in service.urls:  # the tokens window counts them too, on every process
        probe = call(url, made["key"], "/v1/responses", {"model": "nothing", "input": "x"})
        assert probe.headers["x-ratelimit-remaining-tokens"] == str(1_000_000 - spent)
    record = admin.get("/v1/admin/activity", params={"model": "slow", "limit": 1}).json()["requests"][0]
    assert (record["status"], record["error_code"]) == (499, "cancelled")
    assert (record["input_tokens"], record["output_tokens"]) == (day["input_tokens"], day["output_tokens"])


def test_a_request_whose_client_leaves_before_its_whole_answer_is_charged_what_it_used(service, admin):
    """Not streamed: the client gives up waiting (its read timeout) while the answer is generated."""
    made = create(service, admin, name="leaver", tokens_per_minute=1_000_000)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(service.urls[0] + "/v1/responses", headers=bearer(made["key"]), timeout=httpx.Timeout(30, read=0.4),
                   json={"model": "slow", "input": "go"})
    wait_for(lambda: admin.get(f"/v1/admin/keys/{made['id']}/usage").json()["days"], USAGE_PATIENCE)
    [day] = admin.get(f"/v1/admin/keys/{made['id']}/usage").json()["days"]
    assert day["requests"] == 1 and day["input_tokens"] > 0 and 1 <= day["output_tokens"] < 6


def test_requests_over_max_concurrent_are_refused_until_one_ends(service, admin):
    made = create(service, admin, name="concurrent", max_concurrent=1)
    started, done = threading.Event(), []

    def slow_stream():
        with httpx.stream("POST", service.urls[0] + "/v1/responses", headers=bearer(made["key"]), timeout=30,
                          json={"model": "slow", "input": "x", "stream": True}) as stream:
            for _ in stream.iter_raw():
                started.set()
            done.append(stream.status_code)

    runner = threading.Thread(target=slow_stream)
    runner.start()
    try:
        assert started.wait(10)
        refused = call(service.urls[-1], made["key"], "/v1/responses", {"model": "echo", "input": "x"})
        assert (refused.status_code, refused.json()["error"]["code"]) == (429, "concurrency_limited")
        assert refused.headers["Retry-After"] == "1"
    finally:
        runner.join(30)
    assert done == [200]
    assert call(service.urls[-1], made["key"], "/v1/responses", {"model": "echo", "input": "x"}).status_code == 200


def _restart_embedded(service: LiveService) -> None:
    """Stop the embedded service (SIGTERM, as a deploy does) and start it again on the same port and database.
    (The split keeps its budgets in Redis, which an API process's restart does not touch.)"""
    _terminate(service.process)
    service.process = service._spawn(sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(service.port),
                                     "--server", service.server)
    wait_for(lambda: healthy(service.url), 30)


def test_a_spent_budget_stays_spent_across_a_restart_and_the_usage_is_kept(service, admin):
    """The module's last test: the embedded restart leaves its models unloaded."""
    made = create(service, admin, name="budget", token_budget=1_000_000, budget_period="day")
    first = call(service.url, made["key"], "/v1/responses", {"model": "echo", "input": "a b c"})
    spent = usage_tokens(first)
    change(service, admin, made, token_budget=spent + 1)
    second = call(service.urls[-1], made["key"], "/v1/responses", {"model": "echo", "input": "a b c"})
    assert second.status_code == 200  # spent < budget: let in; its tokens then pass the budget
    time.sleep(CHARGED_SECONDS)
    refused = call(service.url, made["key"], "/v1/responses", {"model": "echo", "input": "a b c"})
    assert (refused.status_code, refused.json()["error"]["code"]) == (429, "budget_exhausted")
    now = datetime.now(timezone.utc)
    midnight = datetime.combine(now.date() + timedelta(days=1), datetime.min.time(), timezone.utc)
    assert abs(int(refused.headers["Retry-After"]) - (midnight - now).total_seconds()) < 10

    if service.mode == "embedded":
        _restart_embedded(service)
    again = call(service.url, made["key"], "/v1/responses", {"model": "echo", "input": "a b c"})
    assert (again.status_code, again.json()["error"]["code"]) == (429, "budget_exhausted")

    today = now.date().isoformat()
    expected_days = [{"day": today, "model": "echo", "requests": 2,
                      "input_tokens": 2 * first.json()["usage"]["input_tokens"],
                      "output_tokens": 2 * first.json()["usage"]["output_tokens"]}]
    with httpx.Client(base_url=service.url, headers=AUTH, timeout=30) as fresh_admin:
        wait_for(lambda: fresh_admin.get(f"/v1/admin/keys/{made['id']}/usage").json()["days"] == expected_days,
                 2 * FLUSH_SECONDS + 1)
        usage = fresh_admin.get(f"/v1/admin/keys/{made['id']}/usage").json()
        assert usage["budget"] == {"token_budget": spent + 1, "budget_period": "day", "period_start": today,
                                   "used": 2 * spent, "remaining": 0}
        metrics = httpx.get(service.url + "/metrics", headers=AUTH, timeout=30).text
        expected = f'llmpool_key_tokens_total{{direction="in",key="budget",model="echo"}} ' \
                   f'{float(2 * first.json()["usage"]["input_tokens"])}'
        assert expected in metrics
        for days in ("0", "-1", "x", "401", "9" * 30, "1.5"):
            refused = fresh_admin.get(f"/v1/admin/keys/{made['id']}/usage?days={days}")
            assert (refused.status_code, refused.json()["error"]["code"]) == (400, "invalid_request")
        assert fresh_admin.get("/v1/admin/keys/key_999999/usage").status_code == 404
