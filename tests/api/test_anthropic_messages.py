"""The Anthropic Messages API (POST /v1/messages) with the official ``anthropic`` SDK against a live
service: create and stream (the SDK's ``messages.stream`` accumulator), tools both ways, thinking
blocks, stop reasons, images, errors as the SDK's exception types, ``x-api-key``; each raw stream
event and each message validated strictly against the SDK's own types (no field they do not
declare); on stub models with exact text and on SmolLM2 for real."""
from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from anthropic.types import (
    Message,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
)
from pydantic import BaseModel

from models_app.api.keys import hash_key
from tests.conftest import LiveService, write_settings
from tests.llama_cpp.llama_helpers import SMOLLM2_MODEL

KEY = "sk-anthropic-test"
REPLY = "the quick brown fox"
CITY = {"city": "Paris"}
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
THINKING_MODES = ["default", "enabled", "disabled"]
SMALL_CONTEXT = 256  # llama.cpp's smallest context (it pads a smaller n_ctx up to 256)
MODELS = {
    "fixed": {"backend": "stub", "stub_reply": REPLY},
    "echo": {"backend": "stub", "thinking_modes": THINKING_MODES},
    "thinker": {"backend": "stub", "stub_reply": REPLY, "stub_reasoning": "step one step two",
                "thinking_modes": THINKING_MODES},
    "agent": {"backend": "stub", "stub_tool_calls": [{"name": "get_weather", "arguments": CITY}]},
    "vision": {"backend": "stub", "modalities": ["text", "image"]},
    "flaky": {"backend": "stub", "stub_reply": "one two three four", "stub_fail_after_tokens": 2},
    "lazy": {"backend": "stub", "stub_reply": REPLY, "load_on_request": True, "stub_load_seconds": 1.0},
    "cold": {"backend": "stub"},
    "slow": {"backend": "stub", "stub_reply": "late", "stub_token_delay_ms": 3500},
    # In an engine process: count_tokens crosses it as generate does.
    "smol": {**SMOLLM2_MODEL, "isolation": "process"},
    "smol_small": {**SMOLLM2_MODEL, "gguf_n_ctx": SMALL_CONTEXT},
}
EVENT_TYPES = {
    "message_start": RawMessageStartEvent,
    "message_delta": RawMessageDeltaEvent,
    "message_stop": RawMessageStopEvent,
    "content_block_start": RawContentBlockStartEvent,
    "content_block_delta": RawContentBlockDeltaEvent,
    "content_block_stop": RawContentBlockStopEvent,
}


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    folder = tmp_path_factory.mktemp("anthropic_messages")
    keys = [{"name": "claude", "key_sha256": hash_key(KEY), "models": "*"}]
    live = LiveService(write_settings(folder, MODELS, service={"api_keys": keys},
                                      engine={"decoding": {"temperature": 0.0}}), folder / "db.sqlite3").start()
    try:
        with live.client(timeout=120) as http:
            for name in MODELS:
                if name not in ("cold", "lazy"):
                    assert http.post(f"/v1/admin/models/{name}/load").status_code == 200, name
        yield live
    finally:
        live.stop()


@pytest.fixture
def client(service):
    with anthropic.Anthropic(base_url=service.url, api_key=KEY, max_retries=0, timeout=60) as client:
        yield client


def strict(model: BaseModel) -> BaseModel:
    """``model`` after checking that it, and every model inside it, holds no field its SDK type
    does not declare (the SDK's types accept extra fields; a client written against them would
    not read ours)."""
    assert not model.model_extra, f"{type(model).__name__} has undeclared fields {model.model_extra}"
    for name in type(model).model_fields:
        values = getattr(model, name)
        for value in values if isinstance(values, list) else [values]:
            if isinstance(value, BaseModel):
                strict(value)
    return model


def raw_events(service: LiveService, body: dict, **headers) -> list[tuple[str, dict]]:
    """The (event name, data) pairs of a streamed /v1/messages answer, read with httpx."""
    with httpx.Client(base_url=service.url, timeout=60) as http, http.stream(
        "POST", "/v1/messages?beta=true", json={**body, "stream": True}, headers={"x-api-key": KEY, **headers},
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join(response.iter_text())
    events = []
    for chunk in text.split("\n\n"):
        if chunk.strip():
            lines = dict(line.split(": ", 1) for line in chunk.splitlines())
            events.append((lines["event"], json.loads(lines["data"])))
    return events


def validated(events: list[tuple[str, dict]]) -> list:
    """Each event as the SDK's type of its name, strictly; its name must be its data's type."""
    parsed = []
    for name, data in events:
        assert data["type"] == name
        if name != "ping":
            parsed.append(strict(EVENT_TYPES[name].model_validate(data, strict=True)))
    return parsed


def test_create(client):
    message = client.messages.create(model="fixed", max_tokens=100, messages=[{"role": "user", "content": "hello there"}])
    strict(Message.model_validate(message.to_dict(), strict=True))
    assert message.id.startswith("msg_") and message.model == "fixed" and message.role == "assistant"
    assert [block.type for block in message.content] == ["text"] and message.content[0].text == REPLY
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (2, 4)


def test_the_activity_and_metrics_label_messages(service, client):
    client.messages.create(model="fixed", max_tokens=100, messages=[{"role": "user", "content": "label me"}])
    with service.client() as http:
        (newest,) = http.get("/v1/admin/activity", params={"model": "fixed", "limit": 1}).json()["requests"]
        metrics = http.get("/metrics").text
    assert (newest["endpoint"], newest["input_tokens"], newest["fairness_key"]) == ("messages", 2, "claude")
    assert 'endpoint="messages"' in metrics


def test_system_blocks_system_turn_and_claude_code_fields_are_read(service):
    """System blocks with cache_control, a system turn inside messages, Claude Code's extra
    fields, ?beta=true and the anthropic-* headers: the echo stub counts every text word it got."""
    body = {
        "model": "echo", "max_tokens": 32000,
        "system": [{"type": "text", "text": "you are terse", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "one", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "sig"},
                                              {"type": "text", "text": "ok"}]},
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "red green blue"},
        ],
        "metadata": {"user_id": "user_abc_account__session_1"},
        "context_management": {"edits": []}, "output_config": {"effort": "high"}, "service_tier": "auto",
        "thinking": {"type": "adaptive"},
    }
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219"}
    answer = httpx.post(service.url + "/v1/messages?beta=true", json=body, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    message = strict(Message.model_validate(answer.json(), strict=True))
    assert message.content[0].text == "red green blue"
    # you are terse (3) + one (1) + ok (1) + be brief (2) + red green blue (3): the thinking is left out
    assert message.usage.input_tokens == 10


def test_max_tokens_and_stop_sequences(client):
    cut = client.messages.create(model="echo", max_tokens=2, messages=[{"role": "user", "content": "one two three"}])
    assert (cut.content[0].text, cut.stop_reason, cut.usage.output_tokens) == ("one two", "max_tokens", 2)
    stopped = client.messages.create(model="fixed", max_tokens=100, stop_sequences=["nothing", "brown"],
                                     messages=[{"role": "user", "content": "x"}])
    assert (stopped.content[0].text, stopped.stop_reason, stopped.stop_sequence) == ("the quick ", "stop_sequence", "brown")


def test_stream_events_and_the_sdk_accumulator(service, client):
    events = validated(raw_events(service, {"model": "fixed", "max_tokens": 100,
                                            "messages": [{"role": "user", "content": "x"}]}))
    assert [event.type for event in events] == (
        ["message_start", "content_block_start"] + ["content_block_delta"] * 4
        + ["content_block_stop", "message_delta", "message_stop"]
    )
    assert "".join(event.delta.text for event in events if event.type == "content_block_delta") == REPLY
    assert events[-2].delta.stop_reason == "end_turn" and events[-2].usage.output_tokens == 4
    with client.messages.stream(model="fixed", max_tokens=100, messages=[{"role": "user", "content": "x"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == REPLY and final.content[0].text == REPLY
    assert (final.stop_reason, final.usage.input_tokens, final.usage.output_tokens) == ("end_turn", 1, 4)


def test_tools_both_ways(service, client):
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = client.messages.create(model="agent", max_tokens=100, tools=[WEATHER], messages=question)
    strict(Message.model_validate(called.to_dict(), strict=True))
    (use,) = called.content
    assert (called.stop_reason, use.type, use.name, use.input) == ("tool_use", "tool_use", "get_weather", CITY)
    result = [{"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "Sunny, 21 degrees"}]}]
    history = question + [{"role": "assistant", "content": called.content}, {"role": "user", "content": result}]
    answer = client.messages.create(model="agent", max_tokens=100, tools=[WEATHER], messages=history)
    assert (answer.content[0].text, answer.stop_reason) == ("Sunny, 21 degrees", "end_turn")
    # Streamed: the call's arguments as an input_json_delta, which the accumulator parses.
    events = validated(raw_events(service, {"model": "agent", "max_tokens": 100, "tools": [WEATHER],
                                            "tool_choice": {"type": "tool", "name": "get_weather"}, "messages": question}))
    deltas = [event.delta for event in events if event.type == "content_block_delta"]
    assert [delta.type for delta in deltas] == ["input_json_delta"] and json.loads(deltas[0].partial_json) == CITY
    with client.messages.stream(model="agent", max_tokens=100, tools=[WEATHER], tool_choice={"type": "any"},
                                messages=question) as stream:
        final = stream.get_final_message()
    assert [(block.type, block.name, block.input) for block in final.content] == [("tool_use", "get_weather", CITY)]
    assert final.stop_reason == "tool_use"


def test_thinking_blocks(service, client):
    message = client.messages.create(model="thinker", max_tokens=100, thinking={"type": "enabled", "budget_tokens": 1024},
                                     messages=[{"role": "user", "content": "x"}])
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert (message.content[0].thinking, message.content[1].text) == ("step one step two", REPLY)
    events = validated(raw_events(service, {"model": "thinker", "max_tokens": 100, "thinking": {"type": "enabled",
                                            "budget_tokens": 1024}, "messages": [{"role": "user", "content": "x"}]}))
    starts = [event.content_block.type for event in events if event.type == "content_block_start"]
    assert starts == ["thinking", "text"]
    thought = "".join(e.delta.thinking for e in events if e.type == "content_block_delta" and e.delta.type == "thinking_delta")
    assert thought == "step one step two"
    plain = client.messages.create(model="thinker", max_tokens=100, thinking={"type": "disabled"},
                                   messages=[{"role": "user", "content": "x"}])
    assert [block.type for block in plain.content] == ["text"]
    # A model without thinking modes ignores adaptive and refuses enabled.
    adaptive = client.messages.create(model="fixed", max_tokens=100, thinking={"type": "adaptive"},
                                      messages=[{"role": "user", "content": "x"}])
    assert adaptive.content[0].text == REPLY
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="fixed", max_tokens=100, thinking={"type": "enabled", "budget_tokens": 1024},
                               messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert caught.value.body["error"]["code"] == "thinking_unsupported"


def test_images_where_the_model_accepts_them(client):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    turn = [{"role": "user", "content": [image, {"type": "text", "text": "describe it"}]}]
    assert client.messages.create(model="vision", max_tokens=50, messages=turn).content[0].text == "describe it"
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="fixed", max_tokens=50, messages=turn)
    assert caught.value.body["error"]["code"] == "modality_unsupported"


@pytest.mark.parametrize(
    ("kwargs", "error_class", "error_type", "code"),
    [
        pytest.param({"model": "no-such-model"}, anthropic.NotFoundError, "not_found_error", "unknown_model", id="unknown"),
        pytest.param({"model": "cold"}, anthropic.ConflictError, "invalid_request_error", "model_not_loaded", id="cold"),
        # the stub's sampling_options lack top_k (as an engine without top-k sampling)
        pytest.param({"model": "fixed", "extra_body": {"top_k": 5}}, anthropic.BadRequestError, "invalid_request_error",
                     "invalid_request", id="top_k"),
        pytest.param({"model": "fixed", "max_tokens": 0}, anthropic.BadRequestError, "invalid_request_error",
                     "invalid_request", id="max_tokens"),
    ],
)
def test_errors_as_sdk_exceptions(client, kwargs, error_class, error_type, code):
    with pytest.raises(error_class) as caught:
        client.messages.create(**{"max_tokens": 10, "messages": [{"role": "user", "content": "x"}], **kwargs})
    assert caught.value.body["type"] == "error"
    assert (caught.value.body["error"]["type"], caught.value.body["error"]["code"]) == (error_type, code)


def test_a_wrong_key_and_an_error_mid_stream(service, client):
    with anthropic.Anthropic(base_url=service.url, api_key="wrong", max_retries=0) as wrong:
        with pytest.raises(anthropic.AuthenticationError) as caught:
            wrong.messages.create(model="fixed", max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.APIStatusError) as caught:
        with client.messages.stream(model="flaky", max_tokens=10, messages=[{"role": "user", "content": "x"}]) as stream:
            "".join(stream.text_stream)
    assert caught.value.body["error"]["code"] == "backend_error"


def test_x_api_key_on_the_other_inference_paths(service):
    body = {"model": "fixed", "messages": [{"role": "user", "content": "x"}]}
    answer = httpx.post(service.url + "/v1/chat/completions", json=body, headers={"x-api-key": KEY}, timeout=30)
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == REPLY
    refused = httpx.post(service.url + "/v1/chat/completions", json=body, headers={"x-api-key": "wrong"}, timeout=30)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


def test_a_stream_that_waits_for_a_load_pings(service, client):
    events = raw_events(service, {"model": "lazy", "max_tokens": 100, "messages": [{"role": "user", "content": "x"}]})
    assert events[0] == ("ping", {"type": "ping"}) and events[1][0] == "message_start"
    assert "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta") == REPLY
    validated(events)


def test_count_tokens_on_every_protocol(service, client):
    """The stub counts the words it would read; each protocol's counting path asks it."""
    counted = client.messages.count_tokens(model="agent", system="be terse", tools=[WEATHER],
                                           messages=[{"role": "user", "content": "one two three"}])
    assert counted.input_tokens == 5 and counted.model_dump() == {"input_tokens": 5}
    headers = {"x-api-key": KEY}
    chat = httpx.post(service.url + "/v1/chat/completions/input_tokens", headers=headers, timeout=30,
                      json={"model": "echo", "messages": [{"role": "user", "content": "one two"}]})
    assert chat.status_code == 200 and chat.json() == {"object": "chat.completion.input_tokens", "input_tokens": 2}
    responses = httpx.post(service.url + "/v1/responses/input_tokens", headers=headers, timeout=30,
                           json={"model": "echo", "input": "one two three four", "instructions": "hi"})
    assert responses.status_code == 200 and responses.json() == {"object": "response.input_tokens", "input_tokens": 5}
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.count_tokens(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["error"]["code"] == "unknown_model"
    with pytest.raises(anthropic.ConflictError):
        client.messages.count_tokens(model="cold", messages=[{"role": "user", "content": "x"}])
    refused = httpx.post(service.url + "/v1/chat/completions/input_tokens", headers=headers, timeout=30,
                         json={"model": "echo", "messages": []})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_request"


def test_a_stream_whose_first_token_is_late_pings(service):
    events = raw_events(service, {"model": "slow", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]})
    assert [name for name, _ in events[:3]] == ["message_start", "ping", "content_block_start"]
    assert events[1][1] == {"type": "ping"}
    validated(events)


def test_smollm2_for_real(client):
    message = client.messages.create(model="smol", max_tokens=8, system="Answer briefly.",
                                     messages=[{"role": "user", "content": "What is the capital of France?"}])
    strict(Message.model_validate(message.to_dict(), strict=True))
    assert message.content[0].text.strip() and message.usage.input_tokens > 10
    assert message.stop_reason in ("end_turn", "max_tokens") and 0 < message.usage.output_tokens <= 8
    with client.messages.stream(model="smol", max_tokens=8, messages=[{"role": "user", "content": "Say hi."}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.strip() and final.content[0].text == text and final.usage.output_tokens <= 8
    # count_tokens renders the chat template and tokenizes as the generation did.
    counted = client.messages.count_tokens(model="smol", system="Answer briefly.",
                                           messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert counted.input_tokens == message.usage.input_tokens


def test_an_output_limit_past_a_small_context_is_clamped(service, client):
    """Claude Code's max_tokens 32000, and Ollama's num_predict (and num_ctx) past the context, on a
    llama_cpp model of 256 tokens: not refused; the engine stops where its context is full (its last
    token sampled from the full context)."""
    # A long prompt leaves a short answer before the context is full.
    counting = [{"role": "user", "content": "Go on counting: " + ", ".join(str(n) for n in range(1, 48))}]
    message = client.messages.create(model="smol_small", max_tokens=32000, messages=counting)
    assert message.stop_reason == "max_tokens" and message.content[0].text
    assert message.usage.input_tokens + message.usage.output_tokens == SMALL_CONTEXT + 1
    with service.client(headers={"x-api-key": KEY}, timeout=60) as http:
        answer = http.post("/api/chat", json={"model": "smol_small", "messages": counting, "stream": False,
                                              "options": {"num_predict": 32000, "num_ctx": 1_000_000}})
    data = answer.json()
    assert answer.status_code == 200 and data["done_reason"] == "length" and data["message"]["content"]
    assert data["prompt_eval_count"] + data["eval_count"] == SMALL_CONTEXT + 1
