"""GET /v1/admin/activity and the admin entry's rolling stats, on both shapes."""
import json

from tests.conftest import model_entry

FAST = {"backend": "stub", "stub_reply": "a b c d", "stub_token_delay_ms": 20}


def test_the_ring_keeps_the_last_n_requests_without_text(live_service):
    service = live_service({"f": dict(FAST, enabled=True), "g": dict(FAST, enabled=True)},
                           service={"activity_requests": 3})
    with service.client() as http:
        for index in range(4):
            sent = http.post("/v1/responses", json={"model": "f", "input": f"secret prompt {index}"},
                             headers={"X-LLMPool-Fairness-Key": "alice"})
            assert sent.status_code == 200
        assert http.post("/v1/chat/completions", json={"model": "g", "messages": [
            {"role": "user", "content": "hi"}]}).status_code == 200
        answer = http.get("/v1/admin/activity").json()
        assert answer["size"] == 3 and answer["capture_requests"] is False
        items = answer["requests"]
        assert [(i["model"], i["endpoint"]) for i in items] == [
            ("g", "chat_completions"), ("f", "responses"), ("f", "responses")]
        newest_f = items[1]
        assert newest_f["status"] == 200 and newest_f["error_code"] is None
        assert newest_f["fairness_key"] == "alice" and newest_f["output_tokens"] == 4
        assert newest_f["replica"] == 0 and newest_f["captured"] is False
        assert newest_f["time_to_first_token_ms"] <= newest_f["duration_ms"]
        assert newest_f["tokens_per_second"] > 0
        assert "secret" not in answer.__repr__() and "capture" not in newest_f
        only_f = http.get("/v1/admin/activity", params={"model": "f", "limit": 1}).json()["requests"]
        assert [i["id"] for i in only_f] == [newest_f["id"]]
        unknown = http.get("/v1/admin/activity", params={"model": "nope"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_model"
        bad = http.get("/v1/admin/activity", params={"limit": "4"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"
        stats = model_entry(http, "f")["stats"]
        assert stats["requests"] == 2 and stats["errors"] == 0  # the ring holds two of f's four
        assert stats["output_tokens"] == 8 and stats["ttft_p50_ms"] <= stats["ttft_p95_ms"]
        assert model_entry(http, "g")["stats"]["requests"] == 1


def test_capture_requests_keeps_the_text(live_service):
    service = live_service({"f": dict(FAST, enabled=True)}, service={"capture_requests": True})
    with service.client() as http:
        assert http.post("/v1/responses", json={"model": "f", "input": "the prompt"}).status_code == 200
        item = http.get("/v1/admin/activity").json()["requests"][0]
        # A chat request crosses to the runtime without its typed messages (built from the body there).
        chat = {"model": "f", "messages": [{"role": "user", "content": "the chat prompt"}]}
        assert http.post("/v1/chat/completions", json=chat).status_code == 200
        chat_item = http.get("/v1/admin/activity").json()["requests"][0]
    assert item["captured"] is True
    assert "the prompt" in item["capture"]["request"] and item["capture"]["response"] == "a b c d"
    assert item["capture"]["truncated"] is False
    assert json.loads(chat_item["capture"]["request"]) == {
        "messages": [{"role": "user", "content": [{"type": "input_text", "text": "the chat prompt"}]}]}
    assert chat_item["capture"]["response"] == "a b c d"
