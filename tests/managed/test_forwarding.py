"""``forwarding.forward``: the client's body sent on and the upstream's answer given back (httpx MockTransport)."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from runtime.backends.base import Finished
from runtime.backends.shared.forwarding import (
    UpstreamAnswer,
    UpstreamChunk,
    answer_bound,
    assemble,
    forward,
    forwarded_body,
)
from runtime.backends.llama_server.spec import LLAMA_SERVER
from runtime.backends.vllm_serve.spec import VLLM_SERVE
from runtime.errors import BackendError, ContextLengthExceeded, InvalidRequest

CHAT = {"model": "mine", "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "n": 2, "grammar": "x"}
USAGE = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}


def chunk(content: str | None = None, finish: str | None = None, **fields) -> dict:
    delta = {} if content is None else {"content": content}
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "up",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **fields}


def sse(*events) -> bytes:
    return b"".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events)


class Body(httpx.AsyncByteStream):
    """A streamed answer body that remembers being closed."""

    def __init__(self, data: bytes):
        self.pieces = [data[i:i + 40] for i in range(0, len(data), 40)]
        self.closed = False

    async def __aiter__(self):
        for piece in self.pieces:
            yield piece

    async def aclose(self) -> None:
        self.closed = True


async def run(body: dict, answer: httpx.Response, path: str = "/v1/chat/completions", **kwargs) -> tuple[list, list]:
    sent: list = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append((request.url.path, json.loads(request.content)))
        return answer

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://upstream") as client:
        events = [event async for event in forward(client, path, body, "up", "the upstream", BackendError, **kwargs)]
    return events, sent


# ---- the body ----------------------------------------------------------------------------


def test_the_body_is_the_clients_with_the_upstreams_model_name():
    assert forwarded_body(CHAT, "up") == {**CHAT, "model": "up"}
    assert CHAT["model"] == "mine"  # the client's body itself is left alone


def test_a_stream_asks_for_usage_and_keeps_the_clients_other_stream_options():
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": False, "continuous_usage_stats": True}}
    assert forwarded_body(body, "up")["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert forwarded_body({**CHAT, "stream": True}, "up")["stream_options"] == {"include_usage": True}


def test_llm_pools_thinking_becomes_the_template_switch_unless_the_client_set_it():
    body = {**CHAT, "thinking": "enabled"}
    assert forwarded_body(body, "up", {"enable_thinking": True}) == {
        **CHAT, "model": "up", "chat_template_kwargs": {"enable_thinking": True}
    }
    mine = {**CHAT, "chat_template_kwargs": {"enable_thinking": False, "x": 1}}
    assert forwarded_body(mine, "up", {"enable_thinking": True})["chat_template_kwargs"] == {
        "enable_thinking": False, "x": 1
    }
    prompt = {"model": "mine", "prompt": "Once"}  # a completion has no chat template
    assert forwarded_body(prompt, "up", {"enable_thinking": True}) == {"model": "up", "prompt": "Once"}


# ---- answers -----------------------------------------------------------------------------


async def test_a_non_streamed_answer_is_given_back_whole_with_its_usage():
    answer = {"id": "x", "choices": [{"index": 0, "message": {"content": "a b"}, "finish_reason": "length",
                                      "logprobs": {"content": []}}], "usage": USAGE}
    events, sent = await run(CHAT, httpx.Response(200, json=answer))
    assert sent == [("/v1/chat/completions", {**CHAT, "model": "up"})]
    assert events == [UpstreamAnswer(answer), Finished(input_tokens=7, output_tokens=2, finish_reason="length")]


async def test_the_path_is_the_one_the_client_posted_to():
    answer = {"choices": [{"index": 0, "text": "twelve chars", "finish_reason": "stop"}]}
    events, sent = await run({"model": "mine", "prompt": "p"}, httpx.Response(200, json=answer), "/v1/completions")
    assert sent == [("/v1/completions", {"model": "up", "prompt": "p"})]
    # No usage from the upstream: about four characters a token of the text.
    assert events[-1] == Finished(input_tokens=0, output_tokens=3, finish_reason="stop")


async def test_a_stream_without_usage_asked_loses_the_usage_chunk_and_fields():
    stream = sse(chunk("a", usage=None), chunk("b"), chunk(finish="stop", usage=None),
                 {"id": "c", "choices": [], "usage": USAGE}, "[DONE]")
    events, sent = await run({**CHAT, "stream": True}, httpx.Response(200, stream=Body(stream)))
    assert sent[0][1]["stream_options"] == {"include_usage": True}
    assert events == [UpstreamChunk(chunk("a")), UpstreamChunk(chunk("b")), UpstreamChunk(chunk(finish="stop")),
                      Finished(input_tokens=7, output_tokens=2, finish_reason="stop")]


async def test_a_stream_with_usage_asked_keeps_every_chunk_as_written():
    written = [chunk("a", usage=None), chunk(finish="length", usage=None), {"id": "c", "choices": [], "usage": USAGE}]
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    events, _ = await run(body, httpx.Response(200, stream=Body(b": ping\n\n" + sse(*written, "[DONE]"))))
    assert events == [*(UpstreamChunk(c) for c in written), Finished(7, 2, "length")]


async def test_the_cached_prompt_tokens_come_from_the_usage_or_llama_servers_timings():
    written = [chunk("a", usage=None), {**chunk(finish="stop"), "timings": {"cache_n": 5, "prompt_n": 2}},
               {"id": "c", "choices": [], "usage": USAGE}]
    events, _ = await run({**CHAT, "stream": True}, httpx.Response(200, stream=Body(sse(*written, "[DONE]"))))
    assert events[-1] == Finished(7, 2, "stop", cached_tokens=5)
    answer = {"choices": [{"index": 0, "message": {"content": "a b"}, "finish_reason": "stop"}],
              "usage": {**USAGE, "prompt_tokens_details": {"cached_tokens": 6}}}
    events, _ = await run(CHAT, httpx.Response(200, json=answer))
    assert events[-1] == Finished(7, 2, "stop", cached_tokens=6)


async def test_a_stream_without_any_usage_counts_a_token_per_chunk_with_text():
    events, _ = await run({**CHAT, "stream": True}, httpx.Response(200, stream=Body(sse(
        chunk(""), chunk("a"), chunk("b"), chunk(finish="stop"), "[DONE]"
    ))))
    assert events[-1] == Finished(input_tokens=0, output_tokens=2, finish_reason="stop")


async def test_closing_the_stream_early_closes_the_upstream_connection():
    body = Body(sse(*(chunk(f"t{i}") for i in range(50)), "[DONE]"))

    def handler(request):
        return httpx.Response(200, stream=body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://upstream") as client:
        events = forward(client, "/v1/chat/completions", {**CHAT, "stream": True}, "up", "the upstream", BackendError)
        assert await anext(events) == UpstreamChunk(chunk("t0"))
        assert not body.closed
        await events.aclose()
        assert body.closed


@pytest.mark.parametrize(
    "answer, error, message",
    [
        (httpx.Response(400, json={"error": {"message": "n_probs must be an integer"}}), InvalidRequest,
         "the upstream answered 400: n_probs must be an integer"),
        (httpx.Response(400, json={"error": {"message": "the request exceeds the available context size"}}),
         ContextLengthExceeded, "the upstream answered 400: the request exceeds the available context size"),
        (httpx.Response(503, text="busy"), BackendError, "the upstream answered 503: busy"),
        (httpx.Response(200, text="<html>"), BackendError, "the upstream answered with a body that is not JSON: '<html>'"),
        (httpx.Response(200, json=[1]), BackendError, "the upstream answered list, not a JSON object"),
        (httpx.Response(200, json={"error": {"message": "oom"}}), BackendError,
         "the upstream failed while generating: oom"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_errors(answer, error, message, stream):
    if stream and answer.status_code == 200:
        answer = httpx.Response(200, stream=Body(sse(answer.text) if answer.text.startswith(("{", "[")) else
                                                 b"data: " + answer.content + b"\n\n"))
    with pytest.raises(error) as raised:
        await run({**CHAT, "stream": stream}, answer)
    assert str(raised.value) == message
    assert raised.value.param == ("input" if error is not BackendError else None)


async def test_a_stream_that_ends_without_done_failed():
    with pytest.raises(BackendError, match=r"^the upstream ended the stream without \[DONE\]$"):
        await run({**CHAT, "stream": True}, httpx.Response(200, stream=Body(sse(chunk("a")))))


# ---- a non-streamed request streamed from the upstream (llama-server) ---------------------


async def test_a_request_that_does_not_stream_is_streamed_from_the_upstream_and_given_back_whole():
    pieces = [
        chunk(None),
        {**chunk("Hel"), "choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None,
                                       "logprobs": {"content": [{"token": "Hel", "logprob": -0.1}]}}]},
        {**chunk("lo"), "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": None,
                                      "logprobs": {"content": [{"token": "lo", "logprob": -0.2}]}}]},
        {**chunk(finish="length"), "timings": {"predicted_n": 2}},
        {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "up", "choices": [], "usage": USAGE},
    ]
    pieces[0]["choices"][0]["delta"] = {"role": "assistant", "content": None}
    events, sent = await run(CHAT, httpx.Response(200, stream=Body(sse(*pieces, "[DONE]"))), stream_upstream=True)
    assert sent == [("/v1/chat/completions", {**CHAT, "model": "up", "stream": True,
                                              "stream_options": {"include_usage": True}})]
    whole = {
        "id": "c", "object": "chat.completion", "created": 1, "model": "up", "timings": {"predicted_n": 2},
        "usage": USAGE,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": "length",
                     "logprobs": {"content": [{"token": "Hel", "logprob": -0.1}, {"token": "lo", "logprob": -0.2}]}}],
    }
    assert events == [UpstreamAnswer(whole), Finished(input_tokens=7, output_tokens=2, finish_reason="length")]


async def test_a_stream_asked_for_is_left_as_it_is_with_stream_upstream():
    events, sent = await run({**CHAT, "stream": True}, httpx.Response(200, stream=Body(sse(chunk("a"), "[DONE]"))),
                             stream_upstream=True)
    assert events[0] == UpstreamChunk(chunk("a")) and sent[0][1]["stream"] is True


@pytest.mark.parametrize("body, bound", [
    ({}, None),
    ({"max_tokens": 4}, 4),
    ({"max_completion_tokens": 9}, 9),
    ({"max_tokens": 4, "max_completion_tokens": 30}, 30),  # whichever the upstream reads, at most 30
    ({"n_predict": 8}, 8),
    ({"max_tokens": 4, "n_predict": -1}, None),  # llama.cpp: -1 is no bound, and it wins over max_tokens
    ({"max_tokens": None}, None),
    ({"max_tokens": 0}, None),
    ({"max_tokens": "4"}, None),
    ({"max_tokens": True}, None),
    ({"max_tokens": 4.0}, None),
])
def test_the_answer_bound_is_the_largest_token_limit_the_body_sets(body, bound):
    assert answer_bound(body) == bound


def test_llama_server_gets_a_short_non_streamed_call_unstreamed_and_every_other_one_streamed():
    config = {"llama_server_unstreamed_max_tokens": 16}
    assert [LLAMA_SERVER.streams_upstream(config, False, bound) for bound in (1, 16, 17, None)] == [
        False, False, True, True]
    assert LLAMA_SERVER.streams_upstream(config, True, 1) is True  # the client's own stream stays one
    assert LLAMA_SERVER.streams_upstream({"llama_server_unstreamed_max_tokens": 0}, False, 1) is True
    # A server that notices a client that left without a stream: a call goes as the client asked.
    assert [VLLM_SERVE.streams_upstream({}, stream, None) for stream in (False, True)] == [False, True]


def test_tool_calls_are_joined_by_their_index_and_their_arguments_in_order():
    def call(index, **fields):
        return {"index": 0, "delta": {"tool_calls": [{"index": index, **fields}]}, "finish_reason": None}

    answer = assemble([
        {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {"choices": [call(0, id="call_a", type="function", function={"name": "get", "arguments": ""})]},
        {"choices": [call(0, function={"arguments": '{"ci'})]},
        {"choices": [call(1, id="call_b", type="function", function={"name": "put", "arguments": "{}"})]},
        {"choices": [call(0, function={"arguments": 'ty": "Paris"}'})]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"id": "call_c", "type": "function",
                                                             "function": {"name": "all", "arguments": "{}"}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ])
    assert answer["object"] == "chat.completion"
    assert answer["choices"] == [{
        "index": 0, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get", "arguments": '{"city": "Paris"}'}},
            {"id": "call_b", "type": "function", "function": {"name": "put", "arguments": "{}"}},
            {"id": "call_c", "type": "function", "function": {"name": "all", "arguments": "{}"}},  # no index: whole
        ]},
    }]


def test_completions_join_their_text_and_logprob_lists_choice_by_choice():
    def piece(index, text, finish=None):
        return {"index": index, "text": text, "finish_reason": finish,
                "logprobs": {"tokens": [text], "token_logprobs": [-1.0]}}

    answer = assemble([
        {"id": "t", "object": "text_completion", "choices": [piece(0, "a"), piece(1, "x")]},
        {"id": "t", "object": "text_completion", "choices": [piece(1, "y", "stop"), piece(0, "b", "length")]},
    ])
    assert answer["object"] == "text_completion"
    assert answer["choices"] == [
        {"index": 0, "text": "ab", "finish_reason": "length", "logprobs": {"tokens": ["a", "b"],
                                                                          "token_logprobs": [-1.0, -1.0]}},
        {"index": 1, "text": "xy", "finish_reason": "stop", "logprobs": {"tokens": ["x", "y"],
                                                                        "token_logprobs": [-1.0, -1.0]}},
    ]


async def test_an_upstream_refusal_of_the_stream_is_the_same_refusal():
    refusal = httpx.Response(400, json={"error": {"message": "n_probs must be an integer"}})
    with pytest.raises(InvalidRequest, match="n_probs must be an integer"):
        await run(CHAT, refusal, stream_upstream=True)


async def test_closing_early_closes_the_upstream_stream_of_a_request_that_does_not_stream():
    class StillGenerating(Body):
        """Three chunks, then nothing more yet (no [DONE])."""

        async def __aiter__(self):
            for piece in self.pieces:
                yield piece
            await asyncio.Event().wait()

    stream = StillGenerating(sse(chunk("t0"), chunk("t1"), chunk("t2")))

    def handler(request):
        return httpx.Response(200, stream=stream)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://upstream") as client:
        task = asyncio.ensure_future(anext(forward(client, "/v1/chat/completions", CHAT, "up", "the upstream",
                                                   BackendError, stream_upstream=True)))
        await asyncio.sleep(0.05)
        assert not task.done() and not stream.closed
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert stream.closed  # how llama-server learns the client left
