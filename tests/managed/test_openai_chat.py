"""``openai_chat.chat_completion`` against answers a real server could give, non-streamed (httpx MockTransport)."""
from __future__ import annotations

import json

import httpx
import pytest

from runtime.backends.base import Finished, TextDelta
from runtime.backends.shared.openai_chat import chat_completion
from runtime.errors import BackendError, ContextLengthExceeded

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False, "max_tokens": 8}


async def run(answer: httpx.Response) -> tuple[list, list[dict]]:
    sent: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return answer

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://upstream") as client:
        events = [event async for event in chat_completion(client, "/v1/chat/completions", BODY, "up", BackendError)]
    return events, sent


def completion(content, finish="stop", usage=None) -> httpx.Response:
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}]}
    if usage is not None:
        answer["usage"] = usage
    return httpx.Response(200, json=answer)


async def test_one_answer_is_one_delta_and_the_upstream_usage():
    events, sent = await run(completion("Hello there.", "length", {"prompt_tokens": 7, "completion_tokens": 3}))
    assert sent == [BODY]
    assert events == [TextDelta("Hello there."), Finished(input_tokens=7, output_tokens=3, finish_reason="length")]


@pytest.mark.parametrize("extra, cached", [
    ({"usage": {"prompt_tokens_details": {"cached_tokens": 5}}, "timings": {"cache_n": 4}}, 5),
    ({"timings": {"cache_n": 4, "prompt_n": 3}}, 4),  # llama-server builds without prompt_tokens_details
    ({"usage": {"prompt_tokens_details": {"cached_tokens": "5"}}}, None),
    ({}, None),
])
async def test_the_prompt_tokens_the_upstream_reused_are_read_from_its_usage_or_timings(extra, cached):
    answer = completion("Hi.", usage={"prompt_tokens": 9, "completion_tokens": 1})
    body = {**json.loads(answer.content), **extra}
    body["usage"] = {**json.loads(answer.content)["usage"], **extra.get("usage", {})}
    events, _ = await run(httpx.Response(200, json=body))
    assert events[-1] == Finished(input_tokens=9, output_tokens=1, finish_reason="stop", cached_tokens=cached)


async def test_without_usage_the_output_is_estimated_from_its_length():
    events, _ = await run(completion("twelve chars"))
    assert events == [TextDelta("twelve chars"), Finished(input_tokens=0, output_tokens=3, finish_reason="stop")]


async def test_an_empty_answer_has_no_delta():
    events, _ = await run(completion(None, usage={"prompt_tokens": 4, "completion_tokens": 0}))
    assert events == [Finished(input_tokens=4, output_tokens=0, finish_reason="stop")]


@pytest.mark.parametrize(
    "answer, message",
    [
        (httpx.Response(200, content=b"<html>proxy error</html>"), "up answered 200 with a body that is not JSON"),
        (httpx.Response(200, json=["a"]), "up answered 200 with list, not a chat completion"),
        (httpx.Response(200, json={"error": {"message": "out of memory"}}), "up failed while generating: out of memory"),
        (httpx.Response(200, json={"choices": []}), "up answered without a choice"),
        (httpx.Response(500, json={"error": {"message": "boom"}}), "up answered 500: boom"),
    ],
)
async def test_broken_answers_are_the_failure_class(answer, message):
    with pytest.raises(BackendError) as raised:
        await run(answer)
    assert str(raised.value) == message


async def test_a_context_refusal_is_context_length_exceeded():
    refusal = httpx.Response(400, json={"error": {"message": "the request exceeds the available context size"}})
    with pytest.raises(ContextLengthExceeded):
        await run(refusal)


async def test_logprobs_the_upstream_gives_come_with_the_delta():
    tokens = [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}]
    answer = httpx.Response(200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"},
                                                    "logprobs": {"content": tokens}, "finish_reason": "stop"}]})
    events, _ = await run(answer)
    assert events[0] == TextDelta("Hi", logprobs=tokens)
    bare, _ = await run(httpx.Response(200, json={"choices": [{"message": {"content": "Hi"}, "logprobs": "x"}]}))
    assert bare[0] == TextDelta("Hi")  # no usable logprobs: none, never a failure
