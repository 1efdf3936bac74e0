"""Reasoning, reasoning effort, seed, penalties and logprobs on both APIs against a live service:
the stub's scripted reasoning comes back as message.reasoning_content / delta.reasoning_content
(chat) and as a reasoning output item (Responses), never in the answer; every answer and chunk
validated strictly with the openai package's own types."""
from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.conftest import openai_client, service_with_loaded_models

REPLY = "alpha beta gamma"
REASONING = "I weigh it up"
MODELS = {
    "thinker": {"backend": "stub", "stub_reply": REPLY, "stub_reasoning": REASONING,
                "thinking_modes": ["default", "enabled", "disabled"]},
    "fixed": {"backend": "stub", "stub_reply": REPLY},
}
STREAM_EVENT = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    with service_with_loaded_models(tmp_path_factory.mktemp("chat_sampling"), MODELS, unloaded=()) as live:
        yield live


def chat(http, model="thinker", **fields):
    return http.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "hi"}],
                                                   **fields})


def completion(answer) -> ChatCompletion:
    assert answer.status_code == 200, answer.text
    return ChatCompletion.model_validate(answer.json(), strict=True)


def chunks(http, body: dict) -> list[ChatCompletionChunk]:
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as answer:
        assert answer.status_code == 200
        lines = [line for line in answer.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [ChatCompletionChunk.model_validate(json.loads(line[6:]), strict=True) for line in lines[:-1]]


def body(model="thinker", **fields) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **fields}


# ---- chat completions ----------------------------------------------------------------------


def test_chat_puts_the_reasoning_in_reasoning_content_never_in_content(http):
    answer = completion(chat(http))
    message = answer.choices[0].message
    assert (message.content, message.model_extra["reasoning_content"]) == (REPLY, REASONING)
    assert answer.usage.completion_tokens_details.reasoning_tokens == 7  # <think>, 4 words, </think>, "\n\n"
    assert answer.usage.completion_tokens == 10


def test_chat_streams_the_reasoning_as_delta_reasoning_content_before_the_answer(http):
    streamed = chunks(http, body(stream_options={"include_usage": True}))
    deltas = [chunk.choices[0].delta for chunk in streamed if chunk.choices]
    reasoning = [d.model_extra["reasoning_content"] for d in deltas if "reasoning_content" in (d.model_extra or {})]
    content = [d.content for d in deltas if d.content]
    assert "".join(reasoning) == REASONING and reasoning == ["I", " weigh", " it", " up"]
    assert "".join(content) == REPLY
    first_answer = next(i for i, d in enumerate(deltas) if d.content)
    assert all("reasoning_content" not in (d.model_extra or {}) for d in deltas[first_answer:])
    assert streamed[-1].usage.completion_tokens_details.reasoning_tokens == 7


def test_reasoning_effort_none_turns_thinking_off_and_an_explicit_thinking_wins(http):
    off = completion(chat(http, reasoning_effort="none")).choices[0].message
    assert (off.content, (off.model_extra or {}).get("reasoning_content")) == (REPLY, None)
    on = completion(chat(http, reasoning_effort="none", thinking="enabled")).choices[0].message
    assert on.model_extra["reasoning_content"] == REASONING
    assert completion(chat(http, reasoning_effort="high")).choices[0].message.model_extra["reasoning_content"] == REASONING


def test_chat_logprobs_of_the_answer_non_streamed_and_streamed(http):
    answer = completion(chat(http, model="fixed", logprobs=True, top_logprobs=2, seed=3))
    content = answer.choices[0].logprobs.content
    assert [entry.token for entry in content] == ["alpha", " beta", " gamma"]
    assert content[0].model_dump() == {
        "token": "alpha", "logprob": 0.0, "bytes": list(b"alpha"),
        "top_logprobs": [{"token": "alpha", "logprob": 0.0, "bytes": list(b"alpha")}],
    }
    streamed = chunks(http, body("thinker", logprobs=True))
    tokens = [entry.token for chunk in streamed for choice in chunk.choices if choice.logprobs
              for entry in choice.logprobs.content]
    assert tokens == ["alpha", " beta", " gamma"]  # the answer's only, not the reasoning's
    assert completion(chat(http, model="fixed")).choices[0].logprobs is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"presence_penalty": 0.5}, "presence_penalty"), ({"frequency_penalty": -1}, "frequency_penalty"),
     ({"top_logprobs": 2}, "top_logprobs")],
)
def test_what_the_stub_does_not_honour_is_400_naming_the_field(http, fields, param):
    answer = chat(http, model="fixed", **fields)
    assert answer.status_code == 400, answer.text
    assert (answer.json()["error"]["code"], answer.json()["error"]["param"]) == ("invalid_request", param)


def test_the_openai_client_reads_reasoning_and_logprobs(service):
    with openai_client(service) as client:
        answer = client.chat.completions.create(
            model="thinker", messages=[{"role": "user", "content": "hi"}], reasoning_effort="medium", seed=1,
            logprobs=True,
        )
    assert answer.choices[0].message.content == REPLY
    assert answer.choices[0].message.reasoning_content == REASONING
    assert [entry.token for entry in answer.choices[0].logprobs.content] == ["alpha", " beta", " gamma"]


# ---- responses ---------------------------------------------------------------------------


def test_responses_gives_a_reasoning_item_before_the_message(http):
    answer = http.post("/v1/responses", json={"model": "thinker", "input": "hi"})
    assert answer.status_code == 200, answer.text
    response = Response.model_validate(answer.json(), strict=True)
    reasoning, message = response.output
    assert (reasoning.type, [part.text for part in reasoning.content], reasoning.summary) == ("reasoning", [REASONING], [])
    assert (message.type, message.content[0].text) == ("message", REPLY)
    assert response.usage.output_tokens_details.reasoning_tokens == 7
    off = http.post("/v1/responses", json={"model": "thinker", "input": "hi", "reasoning": {"effort": "minimal"}})
    assert [item["type"] for item in off.json()["output"]] == ["message"]


def test_responses_streams_the_reasoning_item_then_the_message(http):
    with http.stream("POST", "/v1/responses", json={"model": "thinker", "input": "hi", "stream": True,
                                                     "include": ["message.output_text.logprobs"]}) as answer:
        assert answer.status_code == 200
        events = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: ")]
    for event in events:
        STREAM_EVENT.validate_python(event, strict=True)
    assert [event["type"] for event in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        *["response.reasoning_text.delta"] * 4,
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert events[2]["item"]["type"] == "reasoning" and events[2]["output_index"] == 0
    assert events[11]["item"]["type"] == "message" and events[11]["output_index"] == 1
    assert "".join(event["delta"] for event in events if event["type"] == "response.reasoning_text.delta") == REASONING
    assert [event["logprobs"][0]["token"] for event in events if event["type"] == "response.output_text.delta"] == [
        "alpha", " beta", " gamma"
    ]
    final = Response.model_validate(events[-1]["response"], strict=True)
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert [entry.token for entry in final.output[1].content[0].logprobs] == ["alpha", " beta", " gamma"]
