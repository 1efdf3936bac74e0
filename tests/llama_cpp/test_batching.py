"""Several sequences per llama_cpp replica, decoded in one batch, for real (SmolLM2): concurrent
requests answer token for token what each answers alone (fresh, with prefix reuse, with a
restored cache), and a cancelled, abandoned or unloaded request frees its sequence without
touching the others.

"Alone" is the same engine answering one request at a time with its cache cleared first.  The
engines run with flash attention off: llama.cpp's CPU flash attention picks its kernel by the
query rows per sequence of each micro-batch (one-token decode of a lone sequence, several
sequences at once, tiles of a prefill), and those kernels round differently, so with it a
batched answer may part from the lone one at a near tie (llama-server's too).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest
import pytest_asyncio
from llama_helpers import SMOLLM2_MODEL, answer_of

from runtime.backends import BACKENDS
from runtime.backends.base import GenerationRequest, TextDelta
from runtime.backends.llama_cpp import generation
from runtime.backends.llama_cpp.engine import LlamaCppEngine
from runtime.errors import BackendError, ContextLengthExceeded

SPEC = BACKENDS["llama_cpp"]
SLOTS = 4
SYSTEM = "You keep the logbook of a ship's engine room and answer in one short sentence. " + " ".join(
    f"Gauge {i} is read every {i + 2} hours." for i in range(1, 5)
)
QUESTIONS = ["How often is gauge 3 read?", "What is a compass for?", "Name a colour of the sea.",
             "How often is gauge 9 read?"]
KV = {"enabled": True, "max_mib": 256, "max_model_mib": 128, "min_tokens": 16}


def make_engine(state, target_inflight: int = SLOTS, kv: dict | None = None, **fields) -> LlamaCppEngine:
    definition = SPEC.definition_model.model_validate(
        {**SMOLLM2_MODEL, "gguf_n_ctx": 512, "gguf_flash_attn": "off", "target_inflight": target_inflight, **fields})
    context = {"base_dir": str(state), "state_dir": str(state), "kv_store": kv}
    return SPEC.create_engine("m", SPEC.effective_config(definition, {}), 0, context)


def turn(*history: str, max_output_tokens: int = 10) -> GenerationRequest:
    roles = ["user", "assistant"]
    messages = [{"role": roles[i % 2], "content": [{"type": "input_text", "text": text}]}
                for i, text in enumerate(history)]
    return GenerationRequest("r", messages, instructions=SYSTEM, max_output_tokens=max_output_tokens,
                             temperature=0.0).resolved()


async def on_worker(engine: LlamaCppEngine, work, *args):
    return await asyncio.get_running_loop().run_in_executor(engine._worker, work, *args)


async def alone(engine: LlamaCppEngine, requests: list[GenerationRequest]) -> list[tuple[str, int, str]]:
    """Each request by itself on a cleared cache: (text, output tokens, finish reason)."""
    answers = []
    for request in requests:
        await on_worker(engine, engine.context.clear)
        text, finished = await answer_of(engine, request)
        answers.append((text, finished.output_tokens, finished.finish_reason))
    return answers


async def together(engine: LlamaCppEngine, requests: list[GenerationRequest]):
    """The requests at once: [(text, Finished)], in their order."""
    return await asyncio.gather(*(answer_of(engine, request) for request in requests))


async def every_slot_serves(engine: LlamaCppEngine) -> bool:
    """As many short requests as the replica has sequences, at once: each is answered."""
    requests = [GenerationRequest("r", [{"role": "user", "content": [{"type": "input_text", "text": question}]}],
                                  max_output_tokens=2, temperature=0.0).resolved() for question in QUESTIONS]
    answers = await together(engine, requests)
    return len(answers) == SLOTS and all(finished.output_tokens for _, finished in answers)


def summary(answers) -> list[tuple[str, int, str]]:
    return [(text, finished.output_tokens, finished.finish_reason) for text, finished in answers]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tmp_path_factory):
    engine = make_engine(tmp_path_factory.mktemp("batch"))
    await engine.load()
    yield engine
    await engine.unload()


pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_one_context_holds_a_sequence_of_n_ctx_cells_per_slot(engine):
    context = engine.context
    assert (context.n_seq, context.n_ctx) == (SLOTS, 512)
    assert context._lib.llama_n_ctx(context.ctx) == SLOTS * 512
    with pytest.raises(ContextLengthExceeded):  # a sequence holds n_ctx, not the context's total
        await answer_of(engine, GenerationRequest("r", [{"role": "user", "content": [
            {"type": "input_text", "text": "word " * 600}]}], max_output_tokens=2).resolved())


async def test_concurrent_requests_answer_exactly_as_each_alone(engine):
    requests = [turn(question) for question in QUESTIONS[:3]]
    expected = await alone(engine, requests)
    await on_worker(engine, engine.context.clear)
    answers = await together(engine, requests)
    assert summary(answers) == expected
    assert all(text.strip() for text, _, _ in expected)
    assert all(finished.cached_tokens == 0 for _, finished in answers)
    assert sum(1 for tokens in engine.context.sequences if tokens) == 3  # three sequences of the one context


async def test_later_turns_batched_reuse_their_own_sequence_and_answer_as_alone(engine):
    firsts = [turn(question) for question in QUESTIONS[:2]]
    first_answers = await alone(engine, firsts)
    seconds = [turn(question, text, "And why?") for question, (text, _, _) in zip(QUESTIONS, first_answers)]
    expected = await alone(engine, seconds)
    await on_worker(engine, engine.context.clear)
    assert summary(await together(engine, firsts)) == first_answers
    answers = await together(engine, seconds)
    assert summary(answers) == expected
    for request, (_, finished) in zip(firsts, answers):
        prompt = engine.weights.tokenize_prompt(engine.render(request))
        assert finished.cached_tokens >= len(prompt)  # its whole first turn came from its own sequence


async def test_a_request_cancelled_mid_prefill_frees_its_sequence_and_the_others_go_on(engine):
    requests = [turn(question) for question in QUESTIONS[:2]]
    expected = await alone(engine, requests)
    await on_worker(engine, engine.context.clear)
    # No instructions: its prompt parts from the others' right after the chat template's start.
    long_request = GenerationRequest("r", [{"role": "user", "content": [
        {"type": "input_text", "text": " ".join(["Tell me about gauge seven."] * 25)}]}], max_output_tokens=8).resolved()
    long_prompt = engine.weights.tokenize_prompt(engine.render(long_request))
    context = engine.context

    def prefilling() -> list[list[int]]:
        return [tokens for tokens in context.sequences
                if 40 < len(tokens) < len(long_prompt) and tokens == long_prompt[:len(tokens)]]

    context.n_batch = 32  # prefill in small chunks, so the cancel lands between two of them
    try:
        others = asyncio.gather(*(answer_of(engine, request) for request in requests))
        doomed = asyncio.create_task(answer_of(engine, long_request))
        while not prefilling():
            await asyncio.sleep(0.001)
        doomed.cancel()
        answers = await others
    finally:
        await on_worker(engine, lambda: setattr(context, "n_batch", context._lib.llama_n_batch(context.ctx)))
    with contextlib.suppress(asyncio.CancelledError):
        await doomed
    assert summary(answers) == expected
    assert prefilling(), "the long prompt stopped part way, its sequence keeping the chunks decoded"
    assert await every_slot_serves(engine)  # its sequence is free again


async def test_a_client_leaving_mid_batch_leaves_the_other_streams_untouched(engine):
    requests = [turn(question) for question in QUESTIONS[:2]]
    expected = await alone(engine, requests)
    await on_worker(engine, engine.context.clear)

    async def leave_after_first_delta(request) -> None:
        async with contextlib.aclosing(engine.generate(request)) as stream:
            async for event in stream:
                assert isinstance(event, TextDelta)
                return

    leaving = asyncio.create_task(leave_after_first_delta(turn("Count from 1 to 100.", max_output_tokens=100)))
    answers = await together(engine, requests)
    await leaving
    assert summary(answers) == expected
    assert await every_slot_serves(engine)  # the one that left freed its sequence


@contextlib.contextmanager
def counting_wake_ups(loop: asyncio.AbstractEventLoop):
    """Count ``loop.call_soon_threadsafe`` calls (each one wakes the loop) in the list yielded."""
    calls = [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return type(loop).call_soon_threadsafe(loop, *args, **kwargs)

    loop.call_soon_threadsafe = counted
    try:
        yield calls
    finally:
        del loop.call_soon_threadsafe


async def deltas_and_wake_ups(engine: LlamaCppEngine, request: GenerationRequest) -> tuple[list[tuple[str, int]], int]:
    """The (text, tokens) of each delta of ``request``'s answer, and how often the worker woke the loop for them."""
    await on_worker(engine, engine.context.clear)
    deltas = []
    with counting_wake_ups(asyncio.get_running_loop()) as wake_ups:
        async for event in engine.generate(request):
            if isinstance(event, TextDelta):
                deltas.append((event.text, event.tokens))
    return deltas, wake_ups[0]


async def test_a_batch_step_wakes_the_event_loop_once_for_all_its_sequences(engine):
    requests = [dataclasses.replace(turn(question, max_output_tokens=12), stream=True) for question in QUESTIONS]
    await on_worker(engine, engine.context.clear)
    batch = engine.context.batch
    steps = [0]

    def counted_decode(ctx) -> None:
        steps[0] += 1
        type(batch).decode(batch, ctx)

    batch.decode = counted_decode
    try:
        with counting_wake_ups(asyncio.get_running_loop()) as wake_ups:
            answers = await together(engine, requests)
    finally:
        del batch.decode
    tokens = sum(finished.output_tokens for _, finished in answers)
    assert tokens > 2 * steps[0]  # several sequences answered in most steps
    assert wake_ups[0] <= steps[0]


async def test_an_answer_that_does_not_stream_is_handed_over_at_its_start_and_end_in_the_same_deltas(
        engine, monkeypatch):
    streamed = dataclasses.replace(turn("Count from 1 to 100.", max_output_tokens=40), stream=True)
    expected, streamed_wake_ups = await deltas_and_wake_ups(engine, streamed)
    assert streamed_wake_ups >= len(expected) > 10  # a stream: each token as it comes
    monkeypatch.setattr(generation, "HOLD_SECONDS", 3600.0)
    deltas, wake_ups = await deltas_and_wake_ups(engine, dataclasses.replace(streamed, stream=False))
    assert deltas == expected
    assert wake_ups == 2  # the first delta (when output began), then the rest with the end
    # The runtime watches for a request's stop sequences: each delta goes out as it comes.
    deltas, wake_ups = await deltas_and_wake_ups(engine, dataclasses.replace(streamed, stream=False, stop=["zzz"]))
    assert deltas == expected and wake_ups == streamed_wake_ups


async def test_the_deltas_of_an_answer_that_does_not_stream_wait_at_most_the_hold(engine, monkeypatch):
    monkeypatch.setattr(generation, "HOLD_SECONDS", 0.0)
    request = turn("Count from 1 to 100.", max_output_tokens=20)
    deltas, wake_ups = await deltas_and_wake_ups(engine, request)
    assert wake_ups >= len(deltas) > 10


async def test_unload_under_active_batched_streams_ends_each_of_them(tmp_path):
    engine = make_engine(tmp_path)
    await engine.load()
    started = asyncio.Event()
    outcomes: list[str] = []

    async def stream(index: int) -> None:
        try:
            request = GenerationRequest("r", [{"role": "user", "content": [
                {"type": "input_text", "text": f"Count from {index} to 400."}]}], max_output_tokens=400).resolved()
            async for event in engine.generate(request):
                if isinstance(event, TextDelta):
                    started.set()
            outcomes.append("finished")
        except BackendError:
            outcomes.append("ended by the unload")

    streams = [asyncio.create_task(stream(index)) for index in range(SLOTS)]
    await asyncio.wait_for(started.wait(), 60)
    await asyncio.wait_for(engine.unload(), 60)
    await asyncio.wait_for(asyncio.gather(*streams), 10)
    assert outcomes == ["ended by the unload"] * SLOTS
    assert engine.context is None and engine.weights is None
    with pytest.raises(BackendError):
        await answer_of(engine, turn("Hi"))


async def test_batched_conversations_come_back_from_saved_caches_and_answer_as_alone(tmp_path):
    firsts = [turn(question) for question in QUESTIONS[:2]]
    engine = make_engine(tmp_path, kv=KV)
    await engine.load()
    try:
        first_answers = summary(await together(engine, firsts))
        first_lengths = [len(engine.weights.tokenize_prompt(engine.render(request))) for request in firsts]
    finally:
        await engine.unload()  # every sequence saved
    assert len(list((tmp_path / "kv").glob("*/*.kv"))) == 2
    seconds = [turn(question, text, "And why?") for question, (text, _, _) in zip(QUESTIONS, first_answers)]
    engine = make_engine(tmp_path, kv=KV)
    await engine.load()
    try:
        answers = await together(engine, seconds)
        store, engine.kv_store = engine.kv_store, None
        expected = await alone(engine, seconds)
        engine.kv_store = store
    finally:
        await engine.unload()
    assert summary(answers) == expected
    for length, (_, finished) in zip(first_lengths, answers):
        assert finished.cached_tokens >= length  # restored, not decoded


async def test_the_memory_estimate_counts_the_kv_cache_of_every_sequence(smollm2_gguf, tmp_path):
    def parts(target_inflight: int) -> dict:
        definition = SPEC.definition_model.model_validate(
            {**SMOLLM2_MODEL, "model_path": str(smollm2_gguf), "gguf_n_ctx": 2048, "target_inflight": target_inflight})
        return SPEC.estimate_parts(definition, SPEC.effective_config(definition, {}), str(tmp_path))

    one, four = parts(1), parts(4)
    assert one["kv_cache_mib"] > 0 and four["kv_cache_mib"] == 4 * one["kv_cache_mib"]
    assert four["weights_mib"] == one["weights_mib"] and sum(four.values()) > sum(one.values())
    definition = SPEC.definition_model.model_validate({**SMOLLM2_MODEL, "model_path": str(smollm2_gguf)})
    config = SPEC.effective_config(definition, {"target_inflight": 4})
    assert SPEC.vram_estimate(definition, config, 1, str(tmp_path))[0] > SPEC.vram_estimate(
        definition, SPEC.effective_config(definition, {}), 1, str(tmp_path))[0]
