"""Prefix reuse in the llama_cpp engine, for real (SmolLM2 and Gemma 3 270M): a conversation's
later turn decodes only what the KV cache lacks, and answers exactly what a cold context answers.

The cold answer comes from the same engine with its cache cleared first, which is what every
request did before reuse; ``Finished.cached_tokens`` says how many prompt tokens were reused.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest
import pytest_asyncio
from llama_helpers import SMOLLM2_MODEL, answer_of

from runtime.backends import BACKENDS
from runtime.backends.base import Finished, GenerationRequest, TextDelta
from runtime.backends.llama_cpp.engine import LlamaCppEngine
from runtime.backends.llama_cpp.generation import Generation, sampling_options
from runtime.backends.shared.in_process import DONE, Failure
from runtime.errors import BackendError

SPEC = BACKENDS["llama_cpp"]

# Long enough that Gemma 3's conversation outgrows its 512-position sliding window.
SYSTEM = "You are the logbook assistant of a ship's engine room. Answer in one short sentence. " + " ".join(
    f"Rule {i}: gauge {i} is read every {i + 1} hours and its reading goes in column {i % 7}." for i in range(1, 31)
)
QUESTIONS = ["How often is gauge 3 read?", "And gauge 12?", "Which column holds gauge 20?"]


def definition(model: str, gemma3_gguf) -> dict:
    if model == "smollm2":
        return {**SMOLLM2_MODEL, "gguf_n_ctx": 2048}
    # Gemma 3 270M's GGUF carries no chat template: the generic format.
    return {"backend": "llama_cpp", "model_path": str(gemma3_gguf), "prompt_format": "generic",
            "gguf_n_ctx": 2048, "gguf_n_gpu_layers": 0, "gguf_n_threads": 1}


def make_engine(fields: dict, base_dir) -> LlamaCppEngine:
    config = SPEC.effective_config(SPEC.definition_model.model_validate(fields), {})
    return SPEC.create_engine("m", config, 0, {"base_dir": str(base_dir)})


def turn(history: list[str], max_output_tokens: int = 20) -> GenerationRequest:
    """The request of a conversation whose messages alternate user / assistant, starting with user."""
    roles = ["user", "assistant"]
    messages = [
        {"role": roles[i % 2], "content": [{"type": "input_text", "text": text}]} for i, text in enumerate(history)
    ]
    return GenerationRequest(
        "r", messages, instructions=SYSTEM, max_output_tokens=max_output_tokens, temperature=0.0
    ).resolved()


async def on_worker(engine: LlamaCppEngine, work, *args):
    return await asyncio.get_running_loop().run_in_executor(engine._worker, work, *args)


async def cold(engine: LlamaCppEngine, request: GenerationRequest) -> tuple[str, Finished]:
    """The answer without reuse: the cache cleared first, as every request once did."""
    await on_worker(engine, engine.context.clear)
    return await answer_of(engine, request)


def cache_positions(engine: LlamaCppEngine) -> int:
    """How many positions sequence 0 of the KV cache holds (its last position + 1)."""
    lib = engine.context._lib
    return lib.llama_memory_seq_pos_max(lib.llama_get_memory(engine.context.ctx), 0) + 1


def prompt_tokens(engine: LlamaCppEngine, request: GenerationRequest) -> list[int]:
    return engine.weights.tokenize_prompt(engine.render(request))


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["smollm2", "gemma3"])
async def engine(request, tmp_path_factory, gemma3_gguf):
    engine = make_engine(definition(request.param, gemma3_gguf), tmp_path_factory.mktemp(request.param))
    await engine.load()
    yield engine
    await engine.unload()


pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_later_turns_reuse_the_conversation_and_answer_exactly_as_cold(engine):
    history = [QUESTIONS[0]]
    text, finished = await cold(engine, turn(history))
    assert finished.cached_tokens == 0  # a cold start reuses nothing
    previous = prompt_tokens(engine, turn(history))
    for question in QUESTIONS[1:]:
        history += [text, question]
        request = turn(history)
        tokens = prompt_tokens(engine, request)
        text, finished = await answer_of(engine, request)  # right after the previous turn: warm
        assert finished.input_tokens == len(tokens)
        assert common_prefix(previous, tokens) <= finished.cached_tokens < len(tokens)
        assert finished.cached_tokens > len(tokens) // 2  # the system prompt and the earlier turns
        cold_text, cold_finished = await cold(engine, request)
        assert (text, finished.output_tokens, finished.finish_reason) == (
            cold_text, cold_finished.output_tokens, cold_finished.finish_reason
        )
        assert cold_finished.cached_tokens == 0 and text.strip()
        previous = tokens
    if engine.context.n_swa:  # Gemma 3: the conversation went past its window, and reuse still held
        assert len(previous) > engine.context.n_swa


async def test_the_same_prompt_again_reuses_all_but_its_last_token(engine):
    request = turn([QUESTIONS[0]])
    first, _ = await cold(engine, request)
    again, finished = await answer_of(engine, request)
    assert finished.cached_tokens == finished.input_tokens - 1  # the last one is decoded for its logits
    assert again == first


async def test_a_generation_cancelled_mid_answer_leaves_a_cache_the_next_request_reuses(engine):
    request = turn([QUESTIONS[0]], max_output_tokens=200)
    expected, _ = await cold(engine, request)
    async with contextlib.aclosing(engine.generate(request)) as stream:
        async for event in stream:
            assert isinstance(event, TextDelta)
            break  # the client leaves after its first delta
    await on_worker(engine, lambda: None)  # the cancelled generation has ended on the worker
    assert len(engine.context.tokens) == cache_positions(engine) >= len(prompt_tokens(engine, request))
    text, finished = await answer_of(engine, request)
    assert finished.cached_tokens == finished.input_tokens - 1
    assert text == expected


async def test_a_generation_stopped_mid_prefill_keeps_exactly_the_decoded_chunks(engine):
    request = turn([QUESTIONS[2]])
    tokens = prompt_tokens(engine, request)
    expected, _ = await cold(engine, request)
    await on_worker(engine, engine.context.clear)
    checks = iter([False, False, False, True])  # admitted, two prefill chunks, then the request is gone
    events = []

    def set_batch(size: int) -> None:
        engine.context.n_batch = size  # chunks smaller than the prompt (llama.cpp accepts smaller batches)

    assert len(tokens) > 2 * 128
    await on_worker(engine, set_batch, 128)
    generation = Generation(engine.weights, engine.render(request), request, sampling_options(request),
                            events.append, lambda: next(checks), "m")
    engine._batches.submit(generation, engine._worker)
    await on_worker(engine, set_batch, engine.context._lib.llama_n_batch(engine.context.ctx))
    assert len(events) == 2 and isinstance(events[0], Failure) and isinstance(events[0].error, BackendError)
    assert events[1] is DONE  # no token, no Finished
    assert engine.context.tokens == tokens[:256] and cache_positions(engine) == 256
    text, finished = await answer_of(engine, request)
    assert finished.cached_tokens == 256
    assert text == expected


async def test_a_failed_decode_clears_what_the_cache_is_known_to_hold(engine):
    await answer_of(engine, turn([QUESTIONS[0]]))
    assert engine.context.tokens
    failed = threading.Event()

    def decode_out_of_vocabulary() -> None:
        try:
            engine.context.decode([engine.weights.n_vocab + 10])
        except Exception:
            failed.set()

    await on_worker(engine, decode_out_of_vocabulary)
    assert failed.is_set()
    assert engine.context.tokens == [] and cache_positions(engine) == 0
    _, finished = await answer_of(engine, turn([QUESTIONS[0]]))
    assert finished.cached_tokens == 0
