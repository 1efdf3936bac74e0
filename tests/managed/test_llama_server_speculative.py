"""llama-server's speculative decoding for real (the cached build serving SmolLM2, one slot): an
n-gram mode and SmolLM2 as its own draft model start (the flags of each mode), answer a repetitive
prompt through a forwarded and a typed protocol, and each answer's drafted and accepted tokens
(llama-server's ``timings``) reach the activity view, the model's ``stats`` and ``/metrics``."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import model_entry
from tests.managed.helpers import smollm2_server

TABLE = "\n".join(f"| {i} | part-{i:03d} | shelf {chr(65 + i % 5)} | in stock |" for i in range(1, 9))
PROMPT = f"Copy this table exactly, every row:\n{TABLE}"


def counters(text: str, name: str) -> dict[str, float]:
    return {sample.labels["model"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == name}


def test_an_ngram_mode_and_a_draft_model_report_their_drafts(live_service, llama_server_binary, smollm2_gguf,
                                                             tmp_path):
    base = smollm2_server(llama_server_binary, smollm2_gguf)
    service = live_service({
        "ngram": {**base, "llama_server_spec_type": "ngram-mod", "llama_server_spec_ngram_n_max": 16,
                  "llama_server_spec_draft_n_min": 2, "llama_server_spec_ngram_size_n": 8},
        "draft": {**base, "llama_server_spec_type": "draft-simple", "llama_server_draft_model": smollm2_gguf,
                  "llama_server_spec_draft_n_max": 4},
    }, env={"LLMPOOL_STATE_DIR": str(tmp_path / "state")})
    with service.client(timeout=300) as http:
        for name in ("ngram", "draft"):
            assert http.post(f"/v1/admin/models/{name}/load").json()["runtime_state"] == "loaded"
            forwarded = http.post("/v1/chat/completions", json={
                "model": name, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 64,
                "temperature": 0})
            assert forwarded.status_code == 200, forwarded.text
            typed = http.post("/v1/responses", json={"model": name, "input": PROMPT, "max_output_tokens": 64,
                                                     "temperature": 0})
            assert typed.status_code == 200, typed.text
        metrics = http.get("/metrics").text
        for name in ("ngram", "draft"):
            items = http.get("/v1/admin/activity", params={"model": name}).json()["requests"]
            assert [item["endpoint"] for item in items] == ["responses", "chat_completions"]
            for item in items:
                assert item["draft_tokens"] > 0 and 0 < item["accepted_draft_tokens"] <= item["draft_tokens"]
            stats = model_entry(http, name)["stats"]
            drafted = sum(item["draft_tokens"] for item in items)
            accepted = sum(item["accepted_draft_tokens"] for item in items)
            assert (stats["draft_tokens"], stats["accepted_draft_tokens"]) == (drafted, accepted)
            assert counters(metrics, "llmpool_spec_decode_draft_tokens_total")[name] == drafted
            assert counters(metrics, "llmpool_spec_decode_accepted_tokens_total")[name] == accepted
    assert service.stop() == 0
