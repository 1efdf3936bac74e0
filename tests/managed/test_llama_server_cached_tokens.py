"""llama-server's cached prompt tokens for real (the cached build serving SmolLM2, one slot): a
conversation's second turn reports the prefix llama-server reused in every protocol's usage, typed
(Responses, Anthropic Messages) and forwarded (chat completions, streamed or not)."""
from __future__ import annotations

import json

import pytest

from tests.managed.helpers import librarian, smollm2_client, sse_events

SYSTEM = librarian(15)
FIRST, SECOND = "Where are books by Austen?", "And books by Dickens?"


@pytest.fixture
def http(live_service, llama_server_binary, smollm2_gguf, tmp_path):
    with smollm2_client(live_service, llama_server_binary, smollm2_gguf, tmp_path / "state") as client:
        assert client.post("/v1/admin/models/smol/load").json()["runtime_state"] == "loaded"
        yield client


def responses_turns(http) -> tuple[dict, dict]:
    def ask(items):
        body = {"model": "smol", "instructions": SYSTEM, "input": items, "max_output_tokens": 8, "temperature": 0.0}
        return http.post("/v1/responses", json=body).json()

    first = ask([{"role": "user", "content": FIRST}])
    answer = first["output"][-1]["content"][0]["text"]
    second = ask([{"role": "user", "content": FIRST}, {"role": "assistant", "content": answer},
                  {"role": "user", "content": SECOND}])
    return first["usage"], second["usage"]


def messages_turns(http) -> tuple[dict, dict]:
    def ask(messages):
        body = {"model": "smol", "system": SYSTEM, "messages": messages, "max_tokens": 8, "temperature": 0.0}
        return http.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}).json()

    first = ask([{"role": "user", "content": FIRST}])
    second = ask([{"role": "user", "content": FIRST}, {"role": "assistant", "content": first["content"][0]["text"]},
                  {"role": "user", "content": SECOND}])
    return first["usage"], second["usage"]


def chat_turns(http, stream: bool) -> tuple[dict, dict]:
    def ask(messages):
        body = {"model": "smol", "messages": [{"role": "system", "content": SYSTEM}, *messages],
                "max_tokens": 8, "temperature": 0.0, "stream": stream}
        if not stream:
            answer = http.post("/v1/chat/completions", json=body).json()
            return answer["choices"][0]["message"]["content"], answer["usage"]
        body["stream_options"] = {"include_usage": True}
        with http.stream("POST", "/v1/chat/completions", json=body) as events:
            chunks = [json.loads(line[5:]) for line in events.iter_lines()
                      if line.startswith("data:") and line[5:].strip() != "[DONE]"]
        text = "".join(choice["delta"].get("content") or "" for chunk in chunks for choice in chunk["choices"])
        return text, chunks[-1]["usage"]

    answer, first = ask([{"role": "user", "content": FIRST}])
    _, second = ask([{"role": "user", "content": FIRST}, {"role": "assistant", "content": answer},
                     {"role": "user", "content": SECOND}])
    return first, second


def responses_stream_usage(http) -> dict:
    body = {"model": "smol", "instructions": SYSTEM, "input": FIRST, "max_output_tokens": 8, "temperature": 0.0,
            "stream": True}
    with http.stream("POST", "/v1/responses", json=body) as stream:
        return sse_events(stream)[-1]["response"]["usage"]


def test_every_protocol_reports_the_prefix_llama_server_reused(http):
    first, second = responses_turns(http)
    # The system prompt and the first turn: llama-server's slot held them from the first request.
    assert second["input_tokens_details"]["cached_tokens"] >= first["input_tokens"] - 8 > 100
    # The first turn again, streamed: all of it but the last token or so is in the slot's cache.
    again = responses_stream_usage(http)
    assert again["input_tokens_details"]["cached_tokens"] >= first["input_tokens"] - 8
    first, second = messages_turns(http)
    # Anthropic counts the reused tokens apart: input_tokens are those it prefilled.
    assert second["cache_read_input_tokens"] >= first["input_tokens"] + first["cache_read_input_tokens"] - 8
    assert second["input_tokens"] < 40
    for stream in (False, True):
        first, second = chat_turns(http, stream)
        assert second["prompt_tokens_details"]["cached_tokens"] >= first["prompt_tokens"] - 8 > 100
