"""GET /metrics on a live service (both shapes), parsed with prometheus-client's own parser."""
import concurrent.futures

import httpx
from prometheus_client.parser import text_string_to_metric_families

ADMIN, SCRAPER = "admin-secret", "scrape-secret"
FAST = {"backend": "stub", "stub_reply": "a b c d"}
SLOW = {"backend": "stub", "stub_reply": "a b c d", "stub_token_delay_ms": 500}


def scrape(url: str, token: str = SCRAPER) -> dict:
    """{(sample name, frozenset(labels)): value} of one scrape."""
    response = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def runtime_figures(samples: dict) -> dict:
    """The runtime's counters and histograms (what every API process must report alike)."""
    return {key: v for key, v in samples.items() if key[0].startswith("llmpool_") and key[0].endswith(
        ("_total", "_count", "_bucket")) and not key[0].startswith(("llmpool_api_", "llmpool_runtime_process"))}


def test_metrics_move_with_loads_requests_rejections_and_unloads(live_service, api_shape):
    service = live_service(
        {"f": FAST, "s": SLOW, "u": FAST},
        service={"admin_token": ADMIN, "metrics_token": SCRAPER},
        engine={"fairness": {"per_key_queue_limit": 1, "reported_keys": 5}},
    )
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with service.client(headers=admin) as http:
        assert http.post("/v1/admin/models/f/load").status_code == 200
        assert http.post("/v1/admin/models/s/load").status_code == 200
    alice = {"X-LLMPool-Fairness-Key": "alice"}
    for _ in range(2):
        answer = httpx.post(service.url + "/v1/responses", json={"model": "f", "input": "x y"}, headers=alice)
        assert answer.status_code == 200
    with httpx.stream("POST", service.url + "/v1/chat/completions", headers=alice, json={
        "model": "f", "messages": [{"role": "user", "content": "x y"}], "stream": True,
    }) as stream:
        assert stream.status_code == 200 and list(stream.iter_lines())
    assert httpx.post(service.url + "/v1/responses", json={"model": "u", "input": "x"}).status_code == 409
    assert httpx.post(service.url + "/v1/responses", json={"model": "nope", "input": "x"}).status_code == 404
    bob = {"X-LLMPool-Fairness-Key": "bob"}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        codes = sorted(pool.map(
            lambda _: httpx.post(service.url + "/v1/responses", json={"model": "s", "input": "x"}, headers=bob,
                                 timeout=30).status_code, range(3)))
    assert codes == [200, 200, 429]
    with service.client(headers=admin) as http:
        assert http.post("/v1/admin/models/f/unload").status_code == 200

    samples = scrape(service.url)
    assert value(samples, "llmpool_runtime_up") == 1
    assert value(samples, "llmpool_model_loads_total", model="f", result="loaded", reason="admin") == 1
    assert value(samples, "llmpool_model_load_duration_seconds_count", model="f", result="loaded") == 1
    assert value(samples, "llmpool_model_unloads_total", model="f", result="unloaded", reason="admin") == 1
    assert value(samples, "llmpool_model_state", model="f", state="unloaded") == 1
    assert value(samples, "llmpool_model_state", model="f", state="loaded") == 0
    assert value(samples, "llmpool_model_state", model="s", state="loaded") == 1
    assert value(samples, "llmpool_model_loaded_replicas", model="s") == 1
    assert value(samples, "llmpool_model_queue_depth", model="s") == 0
    assert value(samples, "llmpool_requests_total", model="f", endpoint="responses", status="200") == 2
    assert value(samples, "llmpool_requests_total", model="f", endpoint="chat_completions", status="200") == 1
    assert value(samples, "llmpool_requests_total", model="u", endpoint="responses", status="409") == 1
    assert value(samples, "llmpool_requests_total", model="", endpoint="responses", status="404") == 1
    assert value(samples, "llmpool_requests_total", model="s", endpoint="responses", status="429") == 1
    assert value(samples, "llmpool_rejections_total", model="u", code="model_not_loaded") == 1
    assert value(samples, "llmpool_rejections_total", model="", code="unknown_model") == 1
    assert value(samples, "llmpool_rejections_total", model="s", code="fairness_key_queue_full") == 1
    assert value(samples, "llmpool_output_tokens_total", model="f", endpoint="responses") == 8
    assert value(samples, "llmpool_output_tokens_total", model="f", endpoint="chat_completions") == 4
    assert value(samples, "llmpool_time_to_first_token_seconds_count", model="f", endpoint="responses") == 2
    assert value(samples, "llmpool_time_per_output_token_seconds_count", model="s", endpoint="responses") == 2
    assert value(samples, "llmpool_request_duration_seconds_count", model="s", endpoint="responses") == 2
    assert value(samples, "llmpool_fairness_rejections_total", key="bob") == 1
    served = value(samples, "llmpool_fairness_served_tokens_total", key="alice")
    inputs = sum(value(samples, "llmpool_input_tokens_total", model="f", endpoint=e) for e in (
        "responses", "chat_completions"))
    assert served == inputs + 12
    assert value(samples, "llmpool_runtime_process_resident_memory_bytes") > 0
    assert not any("x y" in str(labels) for _, labels in samples)

    # The tokens: none or a wrong one is 401; the admin token opens it too.
    assert httpx.get(service.url + "/metrics").status_code == 401
    refused = httpx.get(service.url + "/metrics", headers={"Authorization": "Bearer wrong"})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
    assert value(scrape(service.url, ADMIN), "llmpool_runtime_up") == 1
    assert httpx.post(service.url + "/metrics").status_code == 405
