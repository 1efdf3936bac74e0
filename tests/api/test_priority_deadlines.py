"""Priority classes, weights and queue deadlines through the API, on both shapes, with the stub
engine: a key's class and the priority header (within the key's class) order a model's queue; a
key of weight 2 is served twice as often as a key of weight 1 while both wait; a request past its
queue timeout (the header's, its key's, or its model's queue_timeout_seconds) is answered 503
queue_deadline_exceeded without reaching the engine, and the next one starts; bad header values
are 400 with the envelope, on every protocol, with nothing queued; /metrics counts the drops."""
from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest

from tests.conftest import LiveService, model_entry, wait_until, write_settings

ADMIN_TOKEN = "prio-admin-secret"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
PRIORITY_HEADER = "X-LLMPool-Priority"
TIMEOUT_HEADER = "X-LLMPool-Queue-Timeout"
TOKEN_MS = 100
HOLD_WORDS = 20  # a request that holds the slot: 20 tokens, 2 s
MODELS = {
    # One slot, so a second request queues; the stub answers the input's words, one per TOKEN_MS.
    "echo": {"backend": "stub", "stub_token_delay_ms": TOKEN_MS},
    # An embedding model whose requests may wait 0.4 s: stub_token_delay_ms is waited once per input.
    "strict": {"backend": "stub", "stub_token_delay_ms": TOKEN_MS, "embeddings": True, "queue_timeout_seconds": 0.4},
}


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    folder = tmp_path_factory.mktemp("priority")
    settings = write_settings(folder, MODELS, service={"admin_token": ADMIN_TOKEN, "priority_header": PRIORITY_HEADER})
    live = LiveService(settings, folder / "db.sqlite3").start()
    try:
        with httpx.Client(base_url=live.url, headers=AUTH, timeout=30) as admin:
            for name in MODELS:
                assert admin.post(f"/v1/admin/models/{name}/load").json()["runtime_state"] == "loaded"
            live.keys = {
                fields["name"]: admin.post("/v1/admin/keys", json=fields).json()["key"]
                for fields in ({"name": "jobs", "priority": "batch"}, {"name": "chat", "priority": "interactive"},
                               {"name": "plain"}, {"name": "heavy", "weight": 2}, {"name": "light"},
                               {"name": "patient", "queue_timeout_seconds": 0.3})
            }
        yield live
    finally:
        live.stop()


@pytest.fixture
def admin(service):
    with httpx.Client(base_url=service.url, headers=AUTH, timeout=30) as client:
        yield client


def respond(service, key: str, text: str = "x", path: str = "/v1/responses", **headers) -> httpx.Response:
    body = {"model": "echo", "input": text}
    if path == "/v1/chat/completions":
        body = {"model": "echo", "messages": [{"role": "user", "content": text}]}
    headers["Authorization"] = f"Bearer {service.keys[key]}"
    return httpx.post(service.url + path, json=body, headers=headers, timeout=30)


def hold(pool, service, model: str = "echo", words: int = HOLD_WORDS):
    """A request that holds ``model``'s one slot for ``words`` tokens (about 2 s), once it runs."""
    if model == "echo":
        held = pool.submit(respond, service, "plain", " ".join(["w"] * words))
    else:
        held = pool.submit(httpx.post, service.url + "/v1/embeddings", timeout=30,
                           json={"model": model, "input": ["w"] * HOLD_WORDS},
                           headers={"Authorization": f"Bearer {service.keys['plain']}"})
    with service.client(headers=AUTH) as http:
        assert wait_until(lambda: model_entry(http, model)["runtime_inflight"] == 1, 10)
    return held


def queued(service, depth: int, model: str = "echo"):
    with service.client(headers=AUTH) as http:
        assert wait_until(lambda: model_entry(http, model)["queue_depth"] == depth, 10)


def activity(admin, count: int) -> list[dict]:
    return admin.get("/v1/admin/activity", params={"model": "echo", "limit": count}).json()["requests"]


def test_a_key_s_class_and_the_priority_header_order_the_queue(service, admin):
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        held = hold(pool, service)
        batch = [pool.submit(respond, service, "jobs", f"b{i}") for i in range(2)]
        queued(service, 2)
        # A batch key may not ask for more; an interactive key may ask for less.
        refused = respond(service, "jobs", **{PRIORITY_HEADER: "interactive"})
        assert refused.status_code == 403
        assert refused.json()["error"] == {"code": "priority_not_allowed", "message": refused.json()["error"]["message"],
                                           "param": PRIORITY_HEADER.lower()}
        lowered = pool.submit(respond, service, "chat", "low", **{PRIORITY_HEADER: "batch"})
        queued(service, 3)
        chat = pool.submit(respond, service, "chat", "hi")
        queued(service, 4)
        answers = [f.result(timeout=30) for f in (held, *batch, lowered, chat)]
    assert [a.status_code for a in answers] == [200] * 5
    # Newest first: the interactive request went first, then the batch class in its VTC order.
    assert [row["fairness_key"] for row in activity(admin, 5)] == ["chat", "jobs", "jobs", "chat", "plain"]


def test_a_request_past_its_queue_timeout_never_starts_and_the_next_one_does(service, admin):
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        held = hold(pool, service)
        started = time.monotonic()
        late = pool.submit(respond, service, "jobs", "late", path="/v1/chat/completions", **{TIMEOUT_HEADER: "0.3"})
        after = pool.submit(respond, service, "jobs", "after")
        dropped = late.result(timeout=30)
        assert not held.done()  # answered at its deadline, while the slot is still held
        assert time.monotonic() - started >= 0.3
        assert dropped.status_code == 503 and dropped.headers["Retry-After"] == "1"
        assert dropped.json()["error"]["code"] == "queue_deadline_exceeded"
        assert held.result(timeout=30).status_code == 200 and after.result(timeout=30).status_code == 200
    newest = activity(admin, 3)
    assert [(row["status"], row["error_code"]) for row in newest] == [(200, None), (200, None),
                                                                      (503, "queue_deadline_exceeded")]
    assert newest[2]["replica"] is None  # it never held a replica
    metrics = httpx.get(service.url + "/metrics", headers=AUTH).text
    assert 'llmpool_queue_drops_total{model="echo",priority="batch",reason="queue_deadline_exceeded"} 1.0' in metrics
    assert 'llmpool_model_queued_requests{model="echo",priority="batch"} 0.0' in metrics


def test_a_key_of_weight_2_is_served_twice_as_often_as_a_key_of_weight_1(service, admin):
    """Requests of equal cost, the light key's queued first: the token-fair order charges the heavy
    key half of each request's tokens, so it gets two turns to the light key's one."""
    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        # 8 s: eight requests are queued one by one behind it, each seen in the queue first,
        # which on a loaded machine (the split: a Redis round trip each) took more than 2 s.
        held = hold(pool, service, words=4 * HOLD_WORDS)
        answers = [held]
        for index, key in enumerate(["light"] * 4 + ["heavy"] * 4):
            answers.append(pool.submit(respond, service, key, "same words"))
            queued(service, index + 1)
        assert [a.result(timeout=60).status_code for a in answers] == [200] * 9
    served = [row["fairness_key"] for row in reversed(activity(admin, 8))]
    assert served == ["light", "heavy", "heavy", "light", "heavy", "heavy", "light", "light"]


def test_a_key_s_queue_timeout_drops_its_queued_request_and_the_header_cannot_lengthen_it(service, admin):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held = hold(pool, service)
        started = time.monotonic()
        late = respond(service, "patient", "late", **{TIMEOUT_HEADER: "60"})
        waited = time.monotonic() - started
        assert (late.status_code, late.json()["error"]["code"]) == (503, "queue_deadline_exceeded")
        assert 0.3 <= waited < 1.5 and not held.done()  # the key's 0.3 s, not the header's 60 s
        assert held.result(timeout=30).status_code == 200


def test_a_model_s_queue_timeout_drops_a_queued_embedding(service):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held = hold(pool, service, "strict")
        late = httpx.post(service.url + "/v1/embeddings", json={"model": "strict", "input": "late"}, timeout=30,
                          headers={"Authorization": f"Bearer {service.keys['chat']}"})
        assert (late.status_code, late.json()["error"]["code"]) == (503, "queue_deadline_exceeded")
        assert held.result(timeout=30).status_code == 200


BAD_HEADERS = [
    (TIMEOUT_HEADER, value, "invalid_queue_timeout") for value in ("-1", "0", "soon", "1e3", "nan", "86401")
] + [(PRIORITY_HEADER, "urgent", "invalid_priority")]
CALLS = {
    "/v1/responses": {"model": "echo", "input": "x"},
    "/v1/chat/completions": {"model": "echo", "messages": [{"role": "user", "content": "x"}]},
    "/v1/completions": {"model": "echo", "prompt": "x"},
    "/v1/embeddings": {"model": "strict", "input": "x"},
    "/v1/messages": {"model": "echo", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
    "/api/chat": {"model": "echo", "messages": [{"role": "user", "content": "x"}]},
}


def test_bad_queue_headers_are_refused_on_every_protocol_with_nothing_queued(service, admin):
    """Every bad value on one protocol, and one on each of the others (the edge reads the headers
    in one place, before the body)."""
    before = activity(admin, 1000)
    tries = [("/v1/chat/completions", bad) for bad in BAD_HEADERS]
    tries += [(path, BAD_HEADERS[index % len(BAD_HEADERS)]) for index, path in enumerate(CALLS)]
    with service.client(headers={"Authorization": f"Bearer {service.keys['plain']}"}) as http:
        for path, (header, value, code) in tries:
            answer = http.post(path, json=CALLS[path], headers={header: value})
            assert answer.status_code == 400, (path, value, answer.text)
            if path == "/api/chat":  # Ollama's error body: its message and llm-pool's code
                assert answer.json()["code"] == code
            else:
                assert (answer.json()["error"]["code"], answer.json()["error"]["param"]) == (code, header.lower())
    assert activity(admin, 1000) == before  # none reached the runtime
    assert model_entry(admin, "echo")["queue_depth"] == 0
