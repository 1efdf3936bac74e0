"""Which calls llama-server gets unstreamed, for real: the cached llama-server serving SmolLM2,
driven in-process through the pool, its engine's upstream client watched.

A call the client does not stream goes unstreamed when its answer is held to at most
``llama_server_unstreamed_max_tokens`` tokens (default 16), and streamed and put back together
otherwise (llama-server would finish a longer abandoned answer for nobody: tests in
test_llama_server.py and test_llama_server_passthrough.py check that its slot is freed)."""
from __future__ import annotations

from runtime.backends.base import Finished, GenerationRequest, TextDelta
from runtime.inputs.request import ForwardedRequest
from runtime.backends.shared.forwarding import UpstreamAnswer
from tests.runtime.helpers import start_pool


def ask(text: str, **fields) -> GenerationRequest:
    message = {"role": "user", "content": [{"type": "input_text", "text": text}]}
    return GenerationRequest(request_id="r", messages=[message], temperature=0.0, **fields).resolved()


def passed_through(max_tokens: int) -> ForwardedRequest:
    body = {"model": "smol", "messages": [{"role": "user", "content": "Say yes."}], "max_tokens": max_tokens,
            "temperature": 0}
    return ForwardedRequest(ask("Say yes."), "/v1/chat/completions", body)


async def collect(engine, request) -> tuple[str, Finished]:
    pieces, finished = [], None
    async for event in engine.generate(request):
        if isinstance(event, TextDelta):
            pieces.append(event.text)
        elif isinstance(event, UpstreamAnswer):
            pieces.append(event.answer["choices"][0]["message"]["content"])
        else:
            finished = event
    return "".join(pieces), finished


def watched(client) -> list[tuple[str, bool]]:
    """The calls ``client`` makes from now on: (``post`` or ``stream``, the body's ``stream``)."""
    calls = []
    post, stream = client.post, client.stream

    async def recorded_post(path, *, json=None, **fields):
        calls.append(("post", bool(json.get("stream"))))
        return await post(path, json=json, **fields)

    def recorded_stream(method, path, *, json=None, **fields):
        calls.append(("stream", bool(json.get("stream"))))
        return stream(method, path, json=json, **fields)

    client.post, client.stream = recorded_post, recorded_stream
    return calls


async def test_a_short_answer_goes_unstreamed_and_a_longer_one_streamed(
    llama_server_binary, smollm2_gguf, state_dir, tmp_path
):
    model = {"backend": "llama_server", "model_path": smollm2_gguf, "llama_server_binary": llama_server_binary,
             "llama_server_n_ctx": 1024, "llama_server_startup_timeout_seconds": 60.0}
    streamed_model = {**model, "llama_server_unstreamed_max_tokens": 0}
    pool, _ = await start_pool(tmp_path, {"smol": model, "smol_streamed": streamed_model})
    try:
        controller = pool.controller("smol")
        await controller.load({}, None)
        engine = controller.engines[0]
        assert engine.config["llama_server_unstreamed_max_tokens"] == 16
        calls = watched(engine._client)

        short, finished = await collect(engine, ask("Say yes.", max_output_tokens=4))
        assert finished.output_tokens == 4 and finished.finish_reason == "length"
        longer, finished = await collect(engine, ask("Say yes.", max_output_tokens=17))
        assert 4 < finished.output_tokens <= 17
        assert longer.startswith(short)  # greedy: the same answer, whichever way it came
        forwarded, finished = await collect(engine, passed_through(4))
        assert forwarded == short and finished.output_tokens == 4
        forwarded_longer, _ = await collect(engine, passed_through(17))
        assert forwarded_longer == longer
        assert calls == [("post", False), ("stream", True), ("post", False), ("stream", True)]

        controller = pool.controller("smol_streamed")
        await controller.load({}, None)
        engine = controller.engines[0]
        calls = watched(engine._client)
        streamed, _ = await collect(engine, ask("Say yes.", max_output_tokens=4))
        assert streamed == short
        assert (await collect(engine, passed_through(4)))[0] == short
        assert calls == [("stream", True), ("stream", True)]  # 0: every call streamed
    finally:
        await pool.shutdown()
