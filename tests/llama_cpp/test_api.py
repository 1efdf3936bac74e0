"""llama_cpp end to end: a real ``manage.py serve`` with real GGUF models, over HTTP and the openai client.

One service (module scope) holds SmolLM2-135M-Instruct and Gemma 3 270M (TranslateGemma
prompt format).  Assertions are about mechanics (statuses, token counts, streaming, error
codes), never the exact text.
"""
from __future__ import annotations

import json
import math
import threading
import time

import anthropic
import openai
import psutil
import pytest
from llama_helpers import SMOLLM2_MODEL, load, start_service

OVERRIDES = {"gguf_n_ctx": 1024, "gguf_type_k": "q8_0", "gguf_type_v": "q8_0"}


@pytest.fixture(scope="module")
def service(tmp_path_factory, gemma3_gguf):
    models = {
        "smol": {**SMOLLM2_MODEL, "replica_max": 2},
        "gemma-translate": {
            "backend": "llama_cpp",
            "model_path": str(gemma3_gguf),
            "prompt_format": "translategemma_template",
            "gguf_n_ctx": 512,
            "gguf_n_gpu_layers": 0,
            "gguf_n_threads": 1,
        },
    }
    live = start_service(tmp_path_factory.mktemp("llama_cpp_api"), models,
                         engine={"decoding": {"temperature": 0.0, "top_p": 1.0, "max_output_tokens": 16}})
    yield live
    assert live.stop() == 0


@pytest.fixture(scope="module")
def http(service):
    with service.client(timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def client(service):
    return openai.OpenAI(base_url=service.url + "/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def smol(http):
    """SmolLM2 loaded with the q8_0 cache overrides; the load answer."""
    return load(http, "smol", OVERRIDES)


def entry(http, name: str) -> dict:
    return next(m for m in http.get("/v1/admin/models").json()["models"] if m["name"] == name)


def test_load_with_overrides_reports_them_exactly(smol, smollm2_gguf):
    assert smol["runtime_state"] == "loaded" and smol["last_error"] is None
    assert smol["load_override"] == OVERRIDES
    assert smol["loaded_replicas"] == 1
    assert smol["capabilities"]["multi_turn"] is True
    assert smol["capabilities"]["thinking_modes"] == ["default"]
    kv_q8 = 2 * (30 * 3 * 64 * 1024 // 32) * 34
    expected = math.ceil((smollm2_gguf.stat().st_size + kv_q8) / 2**20)
    assert (smol["vram_estimate_mib"], smol["vram_estimate_replica_count"], smol["vram_estimate_source"]) == (
        expected, 1, "model_artifact_size"
    )


def test_openai_client_single_turn(smol, client):
    response = client.responses.create(model="smol", input="What is the capital of France?", max_output_tokens=12)
    assert response.status in ("completed", "incomplete")
    assert response.output_text.strip()
    assert response.usage.input_tokens > 5
    assert 0 < response.usage.output_tokens <= 12
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    if response.status == "incomplete":
        assert response.usage.output_tokens == 12


def test_multi_turn_chat_renders_the_whole_conversation(smol, client):
    single = client.responses.create(model="smol", input="And of Germany?", max_output_tokens=4)
    conversation = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "And of Germany?"},
    ]
    multi = client.responses.create(model="smol", input=conversation, instructions="Answer briefly.",
                                    max_output_tokens=8)
    assert multi.status in ("completed", "incomplete")
    assert multi.output_text.strip()
    assert multi.usage.input_tokens > single.usage.input_tokens + 10


def test_usage_reports_the_prompt_tokens_reused_from_the_kv_cache(smol, client):
    # Three identical requests over the model's replicas (replica_max 2): one replica serves two
    # of them, and its second finds the whole prompt in its cache but the last token, which is
    # decoded again for its logits.
    question = [{"role": "user", "content": "Name the colours of the rainbow."}]
    chats = [client.chat.completions.create(model="smol", messages=question, max_tokens=4) for _ in range(3)]
    cached = [chat.usage.prompt_tokens_details.cached_tokens for chat in chats]
    assert all(0 <= n < chat.usage.prompt_tokens for n, chat in zip(cached, chats))
    assert max(cached) == chats[0].usage.prompt_tokens - 1
    answers = [client.responses.create(model="smol", input=question, max_output_tokens=16) for _ in range(3)]
    cached = [answer.usage.input_tokens_details.cached_tokens for answer in answers]
    assert max(cached) == answers[0].usage.input_tokens - 1 == chats[0].usage.prompt_tokens - 1
    # Anthropic's shape: the reused tokens are cache reads, input_tokens the rest of the prompt.
    messages = anthropic.Anthropic(base_url=smol_base_url(client), api_key="x", max_retries=0)
    answers = [messages.messages.create(model="smol", max_tokens=4, messages=question) for _ in range(3)]
    reads = [answer.usage.cache_read_input_tokens for answer in answers]
    assert max(reads) == chats[0].usage.prompt_tokens - 1
    assert all(answer.usage.input_tokens + answer.usage.cache_read_input_tokens == chats[0].usage.prompt_tokens
               for answer in answers)


def smol_base_url(client: openai.OpenAI) -> str:
    """The service's root (the openai client's base URL without its /v1)."""
    return str(client.base_url).rstrip("/").removesuffix("/v1")


def test_streaming_sends_token_deltas(smol, client):
    stream = client.responses.create(model="smol", input="Write a short poem about the sea.",
                                     max_output_tokens=12, stream=True)
    deltas, final = [], None
    for event in stream:
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert final is not None
    assert len(deltas) >= 2
    assert "".join(deltas) == final.output_text
    assert len(deltas) <= final.usage.output_tokens <= 12


def test_max_output_tokens_makes_the_response_incomplete(smol, client):
    response = client.responses.create(model="smol", input="Tell me a long story about a dragon.",
                                       max_output_tokens=2)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 2


def test_a_prompt_longer_than_the_context_is_a_400_and_the_model_stays_loaded(smol, http, client):
    too_long = "word " * 1500
    answer = http.post("/v1/responses", json={"model": "smol", "input": too_long})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "1024" in error["message"]
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="smol", input=too_long)
    assert raised.value.code == "context_length_exceeded"
    # Streaming: the same envelope as the last SSE event.
    with http.stream("POST", "/v1/responses", json={"model": "smol", "input": too_long, "stream": True}) as stream:
        events = [json.loads(line[5:]) for line in stream.iter_lines() if line.startswith("data:")]
    assert events[-1]["type"] == "error" and events[-1]["code"] == "context_length_exceeded"
    assert entry(http, "smol")["runtime_state"] == "loaded"
    assert client.responses.create(model="smol", input="Hi", max_output_tokens=2).usage.output_tokens > 0


def test_a_client_that_goes_away_stops_its_generation(smol, service, http):
    long_body = {"model": "smol", "input": "Count from 1 to 500, separated by commas.", "stream": True,
                 "max_output_tokens": 2000}
    with service.client(timeout=60) as leaving, leaving.stream("POST", "/v1/responses", json=long_body) as stream:
        for line in stream.iter_lines():
            if '"response.output_text.delta"' in line:
                break  # leave after the first of ~1000 tokens
    # The request leaves the runtime within seconds (the full reply would take well over 20 s) ...
    deadline = time.monotonic() + 8
    while entry(http, "smol")["runtime_inflight"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert entry(http, "smol")["runtime_inflight"] == 0
    # ... and the serving process goes idle: the generation does not run on in its worker thread.
    server = psutil.Process(service.process.pid)
    before = server.cpu_times()
    time.sleep(1.0)
    after = server.cpu_times()
    assert (after.user + after.system) - (before.user + before.system) < 0.3
    answer = http.post("/v1/responses", json={"model": "smol", "input": "Hi", "max_output_tokens": 2})
    assert answer.status_code == 200


def test_overrides_the_schema_rejects_change_nothing(http):
    before = entry(http, "gemma-translate")
    for body in ({"gguf_type_k": "q8-0"}, {"gguf_flash_attn": "sometimes"}, {"exllama_cache_size": 32768}):
        answer = http.post("/v1/admin/models/gemma-translate/load", json=body)
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_load_request"
    after = entry(http, "gemma-translate")
    assert (after["runtime_state"], after["load_override"], after["last_error"]) == ("unloaded", {}, None)
    assert after == before


def test_gemma3_translategemma_end_to_end(http):
    rejected = load(http, "gemma-translate", {"gguf_flash_attn": "off", "gguf_type_v": "q4_0"})
    assert rejected["runtime_state"] == "failed"
    assert "flash_attn" in rejected["last_error"] and "type_v=q4_0" in rejected["last_error"]
    loaded = load(http, "gemma-translate")
    assert loaded["runtime_state"] == "loaded" and loaded["last_error"] is None
    assert loaded["capabilities"]["multi_turn"] is False
    try:
        answer = http.post("/v1/responses", json={
            "model": "gemma-translate", "input": "Guten Morgen!", "max_output_tokens": 6,
            "source_lang_code": "de", "target_lang_code": "en",
        })
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["status"] in ("completed", "incomplete")
        assert 0 < body["usage"]["output_tokens"] <= 6
        mixed = http.post("/v1/responses", json={
            "model": "gemma-translate", "input": "Guten Morgen! Bonjour!", "max_output_tokens": 4,
            "source_lang_code": "auto", "target_lang_code": "en",
        })
        assert mixed.status_code == 200
        assert mixed.json()["usage"]["input_tokens"] > body["usage"]["input_tokens"]
        missing = http.post("/v1/responses", json={"model": "gemma-translate", "input": "Hallo"})
        assert missing.status_code == 400
        assert (missing.json()["error"]["code"], missing.json()["error"]["param"]) == (
            "invalid_request", "target_lang_code"
        )
        two_turns = http.post("/v1/responses", json={
            "model": "gemma-translate", "target_lang_code": "en",
            "input": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                      {"role": "user", "content": "c"}],
        })
        assert two_turns.status_code == 400 and two_turns.json()["error"]["code"] == "multi_turn_unsupported"
    finally:
        assert http.post("/v1/admin/models/gemma-translate/unload").json()["runtime_state"] == "unloaded"


def test_unload_waits_for_an_active_stream_which_finishes(smol, service, http):
    events: list[dict] = []
    first_delta = threading.Event()

    def stream_request():
        with service.client(timeout=60) as streaming, streaming.stream("POST", "/v1/responses", json={
            "model": "smol", "input": "Count from 1 to 100, separated by commas.", "stream": True,
            "max_output_tokens": 48,
        }) as stream:
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
                    if events[-1]["type"] == "response.output_text.delta":
                        first_delta.set()

    unloaded: dict = {}

    def unload():
        with service.client(timeout=60) as admin:
            unloaded.update(admin.post("/v1/admin/models/smol/unload").json())

    streamer = threading.Thread(target=stream_request)
    streamer.start()
    assert first_delta.wait(30)
    unloader = threading.Thread(target=unload)
    unloader.start()
    deadline = time.monotonic() + 10
    while entry(http, "smol")["runtime_state"] == "loaded" and time.monotonic() < deadline:
        time.sleep(0.02)
    refused = http.post("/v1/responses", json={"model": "smol", "input": "Hi"})
    streamer.join(60)
    unloader.join(60)
    assert not streamer.is_alive() and not unloader.is_alive()
    # Counting to 100 outlasts 48 tokens, so the stream is still running while the model unloads.
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_unloading"
    assert events[-1]["type"] == "response.incomplete"
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas and deltas == events[-1]["response"]["output"][0]["content"][0]["text"]
    assert unloaded["runtime_state"] == "unloaded"
    assert entry(http, "smol")["load_override"] == {}
